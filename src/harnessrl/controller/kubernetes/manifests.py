"""Pure builders for the manifests of one rollout attempt: a batch/v1 Job and its Secret (the
NetworkPolicy is in ``network_policy``). Plain dicts in, plain dicts out; no client import, no I/O.

Template merge rules (the user's template is deep-copied, never mutated):

- The template may be a Job (``kind: Job``), a Pod, a PodTemplateSpec (``{metadata, spec}``) or a
  PodTemplate; anything else is a ``ConfigError``. Runtime fields (name, uid, status, ...) are dropped.
- Every field harnessrl does not set is kept as written (sidecars, tolerations, nodeSelector, init
  containers, security contexts, GPU limits, ``podFailurePolicy`` (its ``Ignore`` rules become
  ``FailJob``: ``no_second_pod``)...).
- Fields harnessrl sets win: Job name/namespace, ``backoffLimit: 0``, ``completions``/``parallelism``
  1, ``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``, ``restartPolicy: Never``, no
  ``suspend``; harnessrl labels and annotations (merged over the template's, on Job and pod); the
  harness container's ``command`` (= ``launch.argv``, ``args`` dropped), ``workingDir``, memory/CPU
  limits from ``launch.limits``, its ephemeral-storage limit (``ephemeral_storage_limit``; the request
  defaults to 0, not to the limit), and the env vars listed in ``INJECTED_ENV``.
- Env precedence: harnessrl's injected vars > ``launch.env`` > the template's env. The template's
  ``envFrom`` and ``valueFrom`` entries are kept. Host-specific vars in ``HOST_ENV`` (PATH, HOME...)
  are never taken from ``launch.env``: they describe the controller's machine, not the image.
- The pod is hardened (``pod_security``): non-root uid/gid, no capabilities, no privilege escalation,
  a read-only root filesystem with writable emptyDir volumes for the workspace, ``HOME`` and /tmp,
  seccomp ``RuntimeDefault``, no service-account token, no host namespaces. Those fields win over
  the template's; ``PodSecurityConfig(enabled=False)`` leaves the template's as written, and then
  ``automountServiceAccountToken`` only defaults to false (a harness has no business with the API
  server).
- The harness container is the one named ``container_name``, else one named ``harness``, else the
  first container; the image is ``image`` if given, else the template's.

The rollout's API key never appears in the Job: it lives in the Secret and reaches the container
through ``secretKeyRef``. Strings from the harness spec (argv, env values) are escaped for Kubernetes'
``$(VAR)`` expansion and any occurrence of the key is replaced by ``$(OPENAI_API_KEY)``, which the
kubelet expands from the secret-backed variable. The controller renders placeholders for the local
machine, so the local gateway URL, workspace path and task file are translated to the in-cluster
gateway URL, the pod's workspace and the mounted task file in argv, env and files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import posixpath
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

from harnessrl.controller.base import Launch
from harnessrl.controller.harness import MAX_EXEC_STRING
from harnessrl.controller.kubernetes.config import PodSecurityConfig
from harnessrl.controller.kubernetes.harness_injection import inject_harness
from harnessrl.controller.kubernetes.job_template import no_second_pod, normalize_template
from harnessrl.controller.kubernetes.names import (
    ATTEMPT_ANNOTATION,
    CONTAINER_ANNOTATION,
    KEY_DIGEST_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ROLLOUT_ANNOTATION,
)
from harnessrl.controller.kubernetes.pod_security import HOME_DIR, harden_pod
from harnessrl.controller.kubernetes.resources import (
    apply_limits,
    apply_storage_limit,
    check_requests_within_limits,
    harness_container,
)
from harnessrl.errors import BadRequest, ConfigError

SECRET_API_KEY = "api-key"
SECRET_TASK = "task.json"
VOLUME_NAME = "harnessrl"
TASK_MOUNT_DIR = "/harnessrl"
DEFAULT_WORKSPACE = "/workspace"
KEY_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
INJECTED_ENV = (
    *KEY_ENV,
    "OPENAI_BASE_URL",
    "ANTHROPIC_BASE_URL",
    "HARNESSRL_ROLLOUT_ID",
    "HARNESSRL_ATTEMPT",
    "HARNESSRL_TASK",
    "HARNESSRL_TASK_FILE",
)
# The controller copies these from its own machine (or points them at local folders); inside an
# image they would break things (the controller's PATH hides the image's binaries), so pods never
# get them from ``launch.env``. Set them in the template's env if an image needs them.
HOST_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "TZ",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "JAVA_HOME",
        "NODE_PATH",
        "TMPDIR",
        "USER",
        "SHELL",
        "PWD",
    }
)
# A Secret holds at most 1 MiB; leave room for the key, metadata and base64 bookkeeping.
SECRET_MAX_BYTES = 1024 * 1024 - 16 * 1024


def rollout_key(launch: Launch) -> str:
    """The rollout-scoped API key the controller put in the harness env."""
    for name in KEY_ENV:
        if launch.env.get(name):
            return launch.env[name]
    raise BadRequest(f"launch for rollout {launch.rollout_id!r} carries no OPENAI_API_KEY in its env")


def key_digest(key: str) -> str:
    """The SHA-256 of a rollout key, hex: what tells an attempt's Job from another store's Job of the
    same name (``KEY_DIGEST_ANNOTATION``). The key is 24 random bytes: its digest gives nothing away."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def gateway_urls(gateway_url: str, rollout_id: str) -> tuple[str, str]:
    """(OpenAI base URL ending in /v1, Anthropic base URL) of a rollout as seen from a pod."""
    root = f"{gateway_url.rstrip('/')}/rollouts/{quote(rollout_id, safe='')}"
    return f"{root}/v1", root


def _file_entries(launch: Launch) -> list[tuple[str, str]]:
    """(relative path, secret key) for each harness file, sorted so the manifest is deterministic."""
    entries = []
    for index, rel in enumerate(sorted(launch.files)):
        path = PurePosixPath(rel)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise BadRequest(f"harness file path must be relative and inside the workspace: {rel!r}")
        entries.append((path.as_posix(), f"file-{index}"))
    return entries


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _translator(launch: Launch, gateway_url: str, workspace_dir: str):
    """A function mapping local-machine strings (gateway URL, workspace path) to their pod values."""
    openai_url, anthropic_url = gateway_urls(gateway_url, launch.rollout_id)
    mapping: dict[str, str] = {}
    local_openai = launch.env.get("OPENAI_BASE_URL", "")
    suffix = f"/rollouts/{quote(launch.rollout_id, safe='')}/v1"
    if local_openai.endswith(suffix):  # the local gateway's root covers every path under it
        mapping[local_openai[: -len(suffix)]] = gateway_url.rstrip("/")
    for name, target in (("OPENAI_BASE_URL", openai_url), ("ANTHROPIC_BASE_URL", anthropic_url)):
        if launch.env.get(name):
            mapping[launch.env[name]] = target
    mapping[str(launch.workspace)] = workspace_dir
    if launch.inside is not None:  # rendered for the local sandbox's fixed paths: the same in the pod
        mapping[str(launch.inside.workspace)] = workspace_dir
    if launch.env.get("HARNESSRL_TASK_FILE"):  # the controller's task file lives outside the workspace
        mapping[launch.env["HARNESSRL_TASK_FILE"]] = f"{TASK_MOUNT_DIR}/{SECRET_TASK}"
    sources = sorted((s for s in mapping if s and s != mapping[s]), key=len, reverse=True)
    if not sources:
        return lambda text: text
    # Longest first, and not followed by a name character, so /ws/r1 never rewrites /ws/r10.
    pattern = re.compile("(" + "|".join(map(re.escape, sources)) + r")(?![A-Za-z0-9_.\-])")
    return lambda text: pattern.sub(lambda m: mapping[m.group(1)], text)


def _literal(text: str, key: str) -> str:
    """``text`` as a Kubernetes command/env string meaning exactly ``text`` after ``$(VAR)``
    expansion, with the key swapped for a reference to the secret-backed variable."""
    escaped = text.replace("$", "$$")  # '$$' expands to '$', so every literal '$' survives
    return escaped.replace(key.replace("$", "$$"), f"$({KEY_ENV[0]})") if key else escaped


def template_workspace(template: Mapping[str, Any] | None, container_name: str | None = None) -> str:
    """The pod-side workspace: the harness container's ``workingDir`` in the template, else /workspace."""
    container = harness_container(normalize_template(template)["spec"]["template"]["spec"], container_name)
    return container.get("workingDir") or DEFAULT_WORKSPACE


def _merge_named(
    existing: list[dict[str, Any]], ours: list[dict[str, Any]], key: str
) -> list[dict[str, Any]]:
    """Template entries whose ``key`` we do not set, then ours (ours win on a clash)."""
    taken = {entry[key] for entry in ours}
    return [entry for entry in existing if entry.get(key) not in taken] + ours


def _container_env(
    container: dict[str, Any],
    launch: Launch,
    *,
    secret_name: str,
    key: str,
    translate,
    pod_env: dict[str, str],
) -> list[dict[str, Any]]:
    secret_refs = [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": SECRET_API_KEY}}}
        for name in KEY_ENV
    ]
    launch_env = [
        {"name": name, "value": _literal(translate(value), key)}
        for name, value in launch.env.items()
        if name not in INJECTED_ENV and name not in HOST_ENV
    ]
    injected = [{"name": name, "value": _literal(value, key)} for name, value in pod_env.items()]
    # Secret-backed vars first: Kubernetes only expands $(VAR) references to vars defined earlier.
    ours = launch_env + injected
    template_env = [e for e in container.get("env") or [] if e.get("name") not in INJECTED_ENV]
    return secret_refs + _merge_named(template_env, ours, "name")


def build_job_manifest(
    template: Mapping[str, Any] | None,
    launch: Launch,
    *,
    namespace: str,
    job_name: str,
    secret_name: str,
    gateway_url: str,
    labels: Mapping[str, str],
    active_deadline_s: float,
    ttl_after_finished_s: int = 3600,
    image: str | None = None,
    container_name: str | None = None,
    workspace_dir: str | None = None,
    pod_security: PodSecurityConfig | None = None,
    harness_image: str | None = None,
    harness_paths: list[str] | None = None,
    ephemeral_storage_limit: str | None = None,
) -> dict[str, Any]:
    """One batch/v1 Job running one attempt of one rollout (see the module docstring for the rules).
    ``pod_security`` None means the defaults: hardened. ``ephemeral_storage_limit`` caps the harness
    container's disk and is each writable emptyDir's ``sizeLimit`` (None: the template's as written).
    The container's image is the task's own (``launch.image``, docs/environments.md) if it has one,
    else ``image``, else the template's; with a task image and ``harness_image`` the harness is
    copied in (``harness_injection``)."""
    security = pod_security or PodSecurityConfig()
    job = normalize_template(template)
    key = rollout_key(launch)
    pod = job["spec"]["template"]
    pod_spec = pod["spec"]
    container = harness_container(pod_spec, container_name)
    workspace = workspace_dir or container.get("workingDir") or DEFAULT_WORKSPACE
    translate = _translator(launch, gateway_url, workspace)

    annotations = {ROLLOUT_ANNOTATION: launch.rollout_id, ATTEMPT_ANNOTATION: str(launch.attempt)}
    job["metadata"].update(name=job_name, namespace=namespace)
    for meta in (job["metadata"], pod["metadata"]):
        meta["labels"] = {**(meta.get("labels") or {}), **labels, MANAGED_BY_LABEL: MANAGED_BY_VALUE}
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    pod["metadata"]["annotations"][CONTAINER_ANNOTATION] = container.get("name") or "harness"
    job["metadata"]["annotations"][KEY_DIGEST_ANNOTATION] = key_digest(key)

    spec = job["spec"]
    spec.pop("suspend", None)
    no_second_pod(spec)
    spec.update(
        backoffLimit=0,
        completions=1,
        parallelism=1,
        activeDeadlineSeconds=max(1, math.ceil(active_deadline_s)),
        ttlSecondsAfterFinished=int(ttl_after_finished_s),
    )
    pod_spec["restartPolicy"] = "Never"
    for field in ("restartPolicy", "restartPolicyRules"):  # a container's own (1.34+): restarted in place
        container.pop(field, None)
    pod_spec.setdefault("automountServiceAccountToken", False)

    container["name"] = container.get("name") or "harness"
    container["image"] = launch.image or image or container.get("image")
    if not container["image"]:
        raise ConfigError("no image for the harness container: set `image` or put one in job_template")
    container["command"] = [_literal(translate(arg), key) for arg in launch.argv]
    container.pop("args", None)
    try:
        rel_cwd = launch.cwd.relative_to(
            launch.inside.workspace if launch.inside else launch.workspace
        ).as_posix()
    except ValueError:  # a cwd outside the workspace has no meaning in the pod
        rel_cwd = "."
    container["workingDir"] = posixpath.normpath(posixpath.join(workspace, rel_cwd))

    openai_url, anthropic_url = gateway_urls(gateway_url, launch.rollout_id)
    pod_env = {
        "OPENAI_BASE_URL": openai_url,
        "ANTHROPIC_BASE_URL": anthropic_url,
        "HARNESSRL_ROLLOUT_ID": launch.rollout_id,
        "HARNESSRL_ATTEMPT": str(launch.attempt),
        "HARNESSRL_TASK": json.dumps(launch.task, sort_keys=True),
        "HARNESSRL_TASK_FILE": f"{TASK_MOUNT_DIR}/{SECRET_TASK}",
    }
    if len("HARNESSRL_TASK=") + len(pod_env["HARNESSRL_TASK"]) > MAX_EXEC_STRING:
        # Too long for one environment entry (the container's exec would fail with E2BIG, every
        # attempt): the task file holds the same JSON, as on the local runner.
        del pod_env["HARNESSRL_TASK"]
    if security.enabled:  # the image's HOME is read-only; the attempt gets a fresh, writable one
        pod_env["HOME"] = HOME_DIR
    container["env"] = _container_env(
        container, launch, secret_name=secret_name, key=key, translate=translate, pod_env=pod_env
    )
    check_requests_within_limits(
        template,
        launch.limits,
        container_name=container_name,
        ephemeral_storage_limit=ephemeral_storage_limit,
    )
    apply_limits(container, launch.limits)
    if ephemeral_storage_limit is not None:  # before harden_pod: the seed container copies it
        apply_storage_limit(container, ephemeral_storage_limit)
    harden_pod(pod_spec, container, workspace=workspace, config=security, size_limit=ephemeral_storage_limit)
    if launch.image and harness_image:  # the task's image, the harness copied in from its own
        inject_harness(
            pod_spec, container, harness_image=harness_image, paths=harness_paths or [], security=security
        )

    files = _file_entries(launch)
    items = [{"key": SECRET_TASK, "path": SECRET_TASK}] + [{"key": k, "path": k} for _, k in files]
    volume = {
        "name": VOLUME_NAME,
        "secret": {"secretName": secret_name, "items": items, "defaultMode": 0o755},
    }
    pod_spec["volumes"] = _merge_named(pod_spec.get("volumes") or [], [volume], "name")
    mounts = [{"name": VOLUME_NAME, "mountPath": TASK_MOUNT_DIR, "readOnly": True}] + [
        {"name": VOLUME_NAME, "mountPath": posixpath.join(workspace, rel), "subPath": k, "readOnly": True}
        for rel, k in files
    ]
    container["volumeMounts"] = _merge_named(container.get("volumeMounts") or [], mounts, "mountPath")
    return job


def build_secret_manifest(
    launch: Launch,
    *,
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    gateway_url: str,
    workspace_dir: str = DEFAULT_WORKSPACE,
    owner: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The attempt's Secret: the rollout key, the task JSON and the harness files (which may embed the
    key, so they never go into a ConfigMap). ``owner`` is an ownerReference (see ``owner_reference``)
    so the garbage collector deletes the Secret with its Job."""
    translate = _translator(launch, gateway_url, workspace_dir)
    data = {
        SECRET_API_KEY: _b64(rollout_key(launch)),
        SECRET_TASK: _b64(json.dumps(launch.task, sort_keys=True)),
    }
    for rel, secret_key in _file_entries(launch):
        data[secret_key] = _b64(translate(launch.files[rel]))
    size = sum(len(value) * 3 // 4 for value in data.values())
    if size > SECRET_MAX_BYTES:
        raise BadRequest(
            f"task and harness files for rollout {launch.rollout_id!r} take {size} bytes; "
            f"a Secret holds at most {SECRET_MAX_BYTES}: bake large files into the image"
        )
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {**labels, MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        "annotations": {ROLLOUT_ANNOTATION: launch.rollout_id, ATTEMPT_ANNOTATION: str(launch.attempt)},
    }
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata, "data": data}


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to a created Job (it needs the server-assigned uid)."""
    meta = job["metadata"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
    }
