"""A Job template as the config gives it, in any accepted shape, made a Job dict (``normalize_template``).

Pure and free of the runner's settings, so the config (``kubernetes.config``, which checks a template's
shape when it loads) and the manifests (``kubernetes.manifests``) both use it without importing each
other.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from harnessrl.errors import ConfigError

#: Metadata the API server sets on a live object: a template copied from one must not carry it.
_RUNTIME_METADATA = (
    "name",
    "generateName",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "ownerReferences",
)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    """``value`` if it is a mapping (None: an empty one), else a ConfigError naming the field."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}: {value!r}"[:300])
    return dict(value)


def normalize_template(template: Mapping[str, Any] | None) -> dict[str, Any]:
    """Any accepted template shape -> a Job dict with ``spec.template.spec.containers``. Checks the
    shape on the way (a ConfigError naming the field); the runner validates the rest against the
    client's models."""
    t = _mapping(copy.deepcopy(template), "job_template")
    kind = t.get("kind")
    if kind is not None and not isinstance(kind, str):
        raise ConfigError(f"job_template.kind must be a string, got {kind!r}")
    spec = _mapping(t.get("spec"), "job_template.spec")
    if kind == "Job" or (kind is None and "template" in spec):
        job = {**t, "spec": spec}
        where = "job_template.spec.template"
    elif kind == "PodTemplate":
        job = {"spec": {"template": t.get("template")}}
        where = "job_template.template"
    elif kind == "Pod" or (kind is None and ("containers" in spec or not t)):
        job = {"spec": {"template": {"metadata": t.get("metadata"), "spec": spec}}}
        where = "job_template"
    else:
        raise ConfigError(
            f"job_template must be a Job, Pod, PodTemplate or pod template spec; got kind {kind!r}"
        )
    job.pop("status", None)
    job["apiVersion"], job["kind"] = "batch/v1", "Job"
    job_meta = job["metadata"] = _mapping(job.get("metadata"), "job_template.metadata")
    pod = job["spec"]["template"] = _mapping(job["spec"].get("template"), where)
    pod_meta = pod["metadata"] = _mapping(pod.get("metadata"), f"{where}.metadata")
    for meta in (job_meta, pod_meta):
        for field in _RUNTIME_METADATA:
            meta.pop(field, None)
    pod_spec = pod["spec"] = _mapping(pod.get("spec"), f"{where}.spec")
    containers = pod_spec.get("containers")
    if not containers:
        containers = [{"name": "harness"}]
    if not isinstance(containers, list) or not all(isinstance(c, Mapping) for c in containers):
        raise ConfigError(
            f"{where}.spec.containers must be a list of containers (mappings), got {containers!r}"
        )
    pod_spec["containers"] = [dict(c) for c in containers]
    return job
