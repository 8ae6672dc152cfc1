"""The sandbox guarantees a harness pod gets from the cluster: a hardened security context and the
writable volumes a read-only image needs. Pure: ``harden_pod`` edits the Job dict that
``manifests.build_job_manifest`` is building (its own deep copy of the template), no I/O.

Threat model: the harness container runs an agent that may try to game its reward. It must not get
root, Linux capabilities, privilege escalation (setuid binaries), a writable image (to plant
binaries or edit the evaluator's tools), the service-account token, or the host's namespaces
(``hostNetwork`` would also bypass the NetworkPolicy), a view of another container's processes
(``shareProcessNamespace``), root's group (``supplementalGroups`` 0), an unconfined AppArmor or
SELinux domain (``appArmorProfile: Unconfined``, ``seLinuxOptions`` type ``spc_t``), an unmasked
``/proc`` (``procMount: Unmasked``) or the node's disk (``hostPath`` volumes, refused); a template
volume that projects a service-account token is taken out of the harness container. Hardened
fields win over the template's; the template's other security fields are kept. A
``seccompProfile`` or ``appArmorProfile`` of type ``Localhost`` in the template is kept: it is a
deliberate profile, and replacing it with ``RuntimeDefault`` could loosen it; of ``seLinuxOptions``
only ``level`` (the MCS categories) is kept, since its ``type``/``user``/``role`` can pick an
unconfined domain. Weakening anything is explicit, in config (``PodSecurityConfig.enabled =
false``), never a side effect of the template.

Other containers of the template (sidecars, its init containers) keep their container-level
contexts as written; the pod-level fields (non-root, uid/gid, seccomp) apply to them too.

With the root filesystem read-only, the workspace, ``HOME`` and ``/tmp`` are emptyDir volumes (a
path the template's harness container already mounts something at is left to that mount), each with
a ``sizeLimit``: an agent that fills its disk is evicted for its own usage, not the node's. The
image's workspace would be hidden by the empty volume, so an init container running the same image
copies it in first (``seed_workspace``); it needs ``sh`` and ``cp`` in the image, and skips the copy
when the image has no such directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from harnessrl.errors import ConfigError

if TYPE_CHECKING:  # config imports this module in a validator: no import cycle at run time
    from harnessrl.controller.kubernetes.config import PodSecurityConfig

WORKSPACE_VOLUME = "harnessrl-workspace"
HOME_VOLUME = "harnessrl-home"
TMP_VOLUME = "harnessrl-tmp"
HOME_DIR = "/home/harnessrl"
TMP_DIR = "/tmp"
SEED_CONTAINER = "harnessrl-seed-workspace"
SEED_MOUNT = "/harnessrl-seed"
# $1 = the image's workspace, $2 = the volume. -P copies symlinks as links (a link to / must not
# drag the image in); no -p: non-root cannot keep root's ownership, and modes survive without it.
SEED_SCRIPT = 'if [ -d "$1" ]; then cp -RP "$1/." "$2/"; fi'
# The seed copy needs no more than the harness; copying its cpu/memory keeps quotas that demand
# limits on every container satisfied without raising the pod's effective request (the max over
# init containers, vs the sum over app containers). Extended resources (GPUs) are left out.
_SEED_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def _seccomp(existing: dict[str, Any] | None) -> dict[str, Any]:
    """RuntimeDefault, unless the template names its own (Localhost) profile."""
    if existing and existing.get("type") == "Localhost":
        return dict(existing)
    return dict(_RUNTIME_DEFAULT)


def _confined(context: dict[str, Any]) -> dict[str, Any]:
    """``context`` without the fields that would lift the runtime's MAC confinement: an AppArmor
    profile other than a deliberate ``Localhost`` one becomes ``RuntimeDefault`` (``Unconfined``
    goes), and ``seLinuxOptions`` keeps only its ``level`` (``type: spc_t`` is unconfined)."""
    confined = dict(context)
    apparmor = confined.get("appArmorProfile")
    if apparmor is not None and not (isinstance(apparmor, Mapping) and apparmor.get("type") == "Localhost"):
        confined["appArmorProfile"] = dict(_RUNTIME_DEFAULT)
    selinux = confined.pop("seLinuxOptions", None)
    if isinstance(selinux, Mapping) and selinux.get("level"):
        confined["seLinuxOptions"] = {"level": selinux["level"]}
    return confined


def pod_security_context(config: PodSecurityConfig, template: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod-level ``securityContext``: the template's, with the hardened fields set."""
    template = _confined(template or {})
    groups = [g for g in template.pop("supplementalGroups", None) or [] if isinstance(g, int) and g > 0]
    if groups:  # group 0 owns much of an image (root's files with group write): never handed out
        template["supplementalGroups"] = groups
    return {
        **template,
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "runAsGroup": config.run_as_group,
        "fsGroup": config.fs_group,  # emptyDir and secret volumes group-owned: writable/readable as non-root
        "seccompProfile": _seccomp(template.get("seccompProfile")),
    }


def container_security_context(
    config: PodSecurityConfig, template: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The harness (and seed) container's ``securityContext``. The uid fields repeat the pod's
    because a container-level value overrides the pod-level one (a template's ``runAsUser: 0``)."""
    template = _confined(template or {})
    return {
        **template,
        "runAsNonRoot": True,
        "runAsUser": config.run_as_user,
        "runAsGroup": config.run_as_group,
        "procMount": "Default",  # Unmasked would show /proc's kernel knobs the runtime hides
        "privileged": False,
        "allowPrivilegeEscalation": False,  # no_new_privs: setuid binaries (sudo, su) gain nothing
        "capabilities": {"drop": ["ALL"]},  # the template's `add` goes too
        "readOnlyRootFilesystem": True,
        "seccompProfile": _seccomp(template.get("seccompProfile")),
    }


def _seed_container(container: dict[str, Any], workspace: str, config: PodSecurityConfig) -> dict[str, Any]:
    # Kubernetes expands $(VAR) in command strings; '$$' keeps every '$' literal.
    command = [
        arg.replace("$", "$$") for arg in ("sh", "-c", SEED_SCRIPT, SEED_CONTAINER, workspace, SEED_MOUNT)
    ]
    seed: dict[str, Any] = {
        "name": SEED_CONTAINER,
        "image": container["image"],
        "command": command,
        "securityContext": container_security_context(config),
        "volumeMounts": [{"name": WORKSPACE_VOLUME, "mountPath": SEED_MOUNT}],
    }
    if container.get("imagePullPolicy"):
        seed["imagePullPolicy"] = container["imagePullPolicy"]
    resources = init_resources(container)
    if resources:
        seed["resources"] = resources
    return seed


def init_resources(container: Mapping[str, Any]) -> dict[str, Any]:
    """The harness container's cpu/memory/ephemeral-storage requests and limits, for an init
    container of its pod (the seed copy, the harness copier): a ResourceQuota that demands limits
    checks init containers too, and an init container's request does not add to the pod's."""
    resources = {
        kind: {
            k: v
            for k, v in ((container.get("resources") or {}).get(kind) or {}).items()
            if k in _SEED_RESOURCES
        }
        for kind in ("requests", "limits")
    }
    return {kind: values for kind, values in resources.items() if values}


def _host_path_volume_names(volumes: Any) -> list[str]:
    return [
        str(v.get("name")) for v in volumes or [] if isinstance(v, Mapping) and v.get("hostPath") is not None
    ]


def refuse_host_path_volumes(template: Mapping[str, Any] | None) -> None:
    """A ``ConfigError`` if the job template has a ``hostPath`` volume: the node's disk, which a
    hardened pod must not see (writable, it is a way onto the node). Checked when the config loads."""
    from harnessrl.controller.kubernetes.job_template import normalize_template

    names = _host_path_volume_names(normalize_template(template)["spec"]["template"]["spec"].get("volumes"))
    if names:
        raise ConfigError(
            f"job_template: hostPath volumes {names} expose the node's disk to the harness pod; refused "
            "while pod_security.enabled (use an emptyDir/PVC, or pod_security.enabled = false)"
        )


def _projects_token(volume: Any) -> bool:
    """A ``projected`` volume with a ``serviceAccountToken`` source: the pod's API credentials."""
    projected = volume.get("projected") if isinstance(volume, Mapping) else None
    sources = projected.get("sources") if isinstance(projected, Mapping) else None
    return any(isinstance(s, Mapping) and s.get("serviceAccountToken") is not None for s in sources or [])


def unmount_token_volumes(pod_spec: dict[str, Any], container: dict[str, Any]) -> None:
    """Take every volume that projects a service-account token out of the harness ``container``,
    and drop those no other container still mounts. ``automountServiceAccountToken: false`` only
    stops the API server from adding one: a template copied from a live pod (``kubectl get pod -o
    yaml``) carries the ``kube-api-access-*`` volume it added and the mount at
    /var/run/secrets/kubernetes.io/serviceaccount, and with them the kubelet wrote a token into the
    harness's filesystem all the same."""
    tokens = {v.get("name") for v in pod_spec.get("volumes") or [] if _projects_token(v)}
    if not tokens:
        return
    container["volumeMounts"] = [
        m for m in container.get("volumeMounts") or [] if m.get("name") not in tokens
    ]
    others = [*(pod_spec.get("containers") or []), *(pod_spec.get("initContainers") or [])]
    mounted = {m.get("name") for c in others for m in c.get("volumeMounts") or [] if isinstance(m, Mapping)}
    pod_spec["volumes"] = [
        v for v in pod_spec.get("volumes") or [] if v.get("name") not in tokens or v.get("name") in mounted
    ]


def harden_pod(
    pod_spec: dict[str, Any],
    container: dict[str, Any],
    *,
    workspace: str,
    config: PodSecurityConfig,
    size_limit: str | None = None,
) -> None:
    """Set the hardened contexts on ``pod_spec`` and the harness ``container`` and add the writable
    volumes (and the seed init container), each capped at ``size_limit`` (the kubelet evicts a pod
    whose emptyDir grows past it). A no-op when ``config.enabled`` is false."""
    if not config.enabled:
        return
    host_paths = _host_path_volume_names(pod_spec.get("volumes"))
    if host_paths:
        raise ConfigError(
            f"job_template: hostPath volumes {host_paths} are refused while pod_security.enabled"
        )
    pod_spec["securityContext"] = pod_security_context(config, pod_spec.get("securityContext"))
    pod_spec["automountServiceAccountToken"] = False  # the template cannot hand the agent a token
    unmount_token_volumes(pod_spec, container)  # nor through a volume of its own
    for field in ("hostNetwork", "hostPID", "hostIPC"):  # host namespaces escape the NetworkPolicy
        pod_spec[field] = False
    # A shared PID namespace shows the harness the other containers' processes and their
    # /proc/<pid>/root (a sidecar's files, environment, credentials).
    pod_spec["shareProcessNamespace"] = False
    container["securityContext"] = container_security_context(config, container.get("securityContext"))

    mounts = list(container.get("volumeMounts") or [])
    taken = {m.get("mountPath", "").rstrip("/") or "/" for m in mounts}
    volumes = list(pod_spec.get("volumes") or [])
    ours = []
    for name, path in ((WORKSPACE_VOLUME, workspace), (HOME_VOLUME, HOME_DIR), (TMP_VOLUME, TMP_DIR)):
        if path.rstrip("/") in taken:  # the template's mount (a PVC, say) is kept
            continue
        taken.add(path.rstrip("/"))
        ours.append(name)
        empty_dir = {"sizeLimit": size_limit} if size_limit is not None else {}
        volumes = [v for v in volumes if v.get("name") != name] + [{"name": name, "emptyDir": empty_dir}]
        mounts.append({"name": name, "mountPath": path})
    pod_spec["volumes"] = volumes
    container["volumeMounts"] = mounts
    if config.seed_workspace and WORKSPACE_VOLUME in ours:
        init = [c for c in pod_spec.get("initContainers") or [] if c.get("name") != SEED_CONTAINER]
        pod_spec["initContainers"] = [_seed_container(container, workspace, config), *init]
