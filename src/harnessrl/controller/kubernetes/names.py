"""Deterministic Kubernetes names and labels for rollout attempts.

A Job's name is a pure function of (run scope, rollout id, attempt), so a restarted controller derives
the same name, finds the Job its predecessor created, and never creates a duplicate. Names are
DNS-1123 labels (lowercase alphanumerics and '-', at most 63 characters): a Job's name is copied into
its pods' ``job-name`` label, so the stricter label limit applies, not the 253 of a subdomain.
Rollout ids are free-form, so the readable part of the name is a slug and uniqueness comes from a
hash of the exact id; the exact id itself travels in an annotation.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "harnessrl"
RUN_LABEL = "harnessrl/run-id"
ROLLOUT_LABEL = "harnessrl/rollout-id"
ATTEMPT_LABEL = "harnessrl/attempt"
# The runner (one per controller process) that created a Job or Secret: a random id drawn when the
# runner is built. Several controllers may share a run (and so a label selector); each deletes as
# orphans only what carries its own id (see reconcile.plan).
CONTROLLER_LABEL = "harnessrl/controller"
# Label values are capped at 63 characters and a restricted alphabet; annotations are not, so the
# exact ids are kept there for anything that must match a store record.
ROLLOUT_ANNOTATION = "harnessrl/rollout-id"
ATTEMPT_ANNOTATION = "harnessrl/attempt"
CONTAINER_ANNOTATION = "harnessrl/harness-container"
# When a runner last wrote an attempt's Secret (epoch seconds; it rewrites it on every create retry):
# a Secret with no Job is swept once this is older than the grace, whichever controller wrote it.
WRITTEN_AT_ANNOTATION = "harnessrl/written-at"
# On the Job: the SHA-256 of the attempt's rollout key (a fresh random key per attempt, so this names
# the attempt across stores). A Job found under an attempt's name with another digest was made for
# another store's rollout of the same id under the same run id; it is never adopted (runner._create).
KEY_DIGEST_ANNOTATION = "harnessrl/key-sha256"

DNS1123_LABEL_MAX = 63
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_HASH_LEN = 10


def _digest(text: str, length: int = _HASH_LEN) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def _slug(text: str) -> str:
    """Lowercase, runs of anything outside [a-z0-9] collapsed to one '-', no leading/trailing '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def is_dns1123_label(name: str) -> bool:
    return len(name) <= DNS1123_LABEL_MAX and bool(_DNS1123_LABEL.fullmatch(name))


def resource_name(rollout_id: str, attempt: int, *, scope: str = "", prefix: str = "hrl") -> str:
    """The name shared by the Job and the Secret of one attempt (different kinds may share a name).

    ``scope`` (the run id) is hashed in so two runs whose stores reuse rollout ids cannot collide in
    one namespace. Deterministic: same inputs, same name, across processes and restarts.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    prefix_slug = _slug(prefix) or "hrl"
    digest = _digest(f"{scope}\x00{rollout_id}")
    tail = f"-{digest}-a{attempt}"
    room = DNS1123_LABEL_MAX - len(prefix_slug) - 1 - len(tail)
    if room < 0:
        raise ValueError(f"name prefix {prefix!r} is too long for a {DNS1123_LABEL_MAX}-character name")
    readable = _slug(rollout_id)[:room].strip("-")
    name = f"{prefix_slug}-{readable}{tail}" if readable else f"{prefix_slug}{tail}"
    assert is_dns1123_label(name), name
    return name


def label_value(value: str) -> str:
    """``value`` if it is a valid label value, else a readable prefix plus a hash of the original."""
    if len(value) <= DNS1123_LABEL_MAX and _LABEL_VALUE.fullmatch(value):
        return value
    digest = _digest(value)
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[: DNS1123_LABEL_MAX - len(digest) - 1]
    readable = readable.strip("-_.")
    return f"{readable}-{digest}" if readable else digest


def run_labels(run_id: str) -> dict[str, str]:
    """Labels shared by everything one runner manages; the runner's list/watch selector."""
    return {MANAGED_BY_LABEL: MANAGED_BY_VALUE, RUN_LABEL: label_value(run_id)}


def attempt_labels(
    run_id: str, rollout_id: str, attempt: int, *, controller: str | None = None
) -> dict[str, str]:
    labels = {**run_labels(run_id), ROLLOUT_LABEL: label_value(rollout_id), ATTEMPT_LABEL: str(attempt)}
    if controller is not None:
        labels[CONTROLLER_LABEL] = label_value(controller)
    return labels


def label_selector(labels: Mapping[str, str]) -> str:
    """Equality-based selector string (``k=v,k2=v2``) as the API's ``labelSelector`` takes it."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
