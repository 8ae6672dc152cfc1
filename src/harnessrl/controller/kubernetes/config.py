"""Settings of the Kubernetes runner (no Kubernetes client import, so config loading stays light)."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from harnessrl.controller.kubernetes.observed import parse_quantity

# Below this the TTL controller may delete a finished Job (and its pods) before the runner has read
# the harness container's exit status, which would turn an exit code or OOM into "job disappeared".
MIN_TTL_AFTER_FINISHED_S = 60
# What the API server accepts as a namespace (a DNS-1123 label) and as a NetworkPolicy's name (a
# DNS-1123 subdomain). Checked when the config loads: an invalid one was only refused by the API at
# the first launch, failing every rollout in turn instead of the config naming the field.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def _dns1123_label(value: str | None, info: ValidationInfo) -> str | None:
    if value is not None and not _DNS1123_LABEL.fullmatch(value):
        raise ValueError(
            f"{info.field_name}: {value!r} is not a Kubernetes namespace name (lowercase letters, digits "
            "and '-', at most 63 characters, starting and ending with a letter or digit)"
        )
    return value


class NetworkPolicyConfig(BaseModel):
    """The egress allow-list for harness pods: the gateway (by pod labels or CIDR) and nothing else.

    Cluster DNS is off by default: the cluster's resolver forwards names it does not own to the
    outside world, so a pod that may query it has a way out (data in the names it looks up). The
    gateway is then reached by address (``gateway_url`` with an IP, checked in
    ``KubernetesRunnerConfig``); ``allow_dns = true`` is the explicit way out for images that must
    resolve names."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        default="harnessrl-harness-egress",
        description="the namespace's deny-all baseline; this run's allow-list is <name>-<hash of run_id>",
    )
    gateway_port: int = Field(ge=1, le=65535, description="the gateway's port as pods reach it")
    gateway_pod_labels: dict[str, str] | None = Field(default=None, description="labels of the gateway pods")
    gateway_namespace: str | None = Field(
        default=None, description="namespace of the gateway pods, if not the runner's namespace"
    )
    gateway_cidr: str | None = Field(default=None, description="instead of pod labels: the gateway's address")
    allow_dns: bool = Field(
        default=False,
        description="port 53 to the cluster DNS pods; they forward outside names, so a pod may tunnel "
        "data out through its lookups (off: gateway_url must name the gateway by IP)",
    )
    dns_namespace: str = "kube-system"
    dns_pod_labels: dict[str, str] = Field(default_factory=lambda: {"k8s-app": "kube-dns"})

    _namespaces = field_validator("gateway_namespace", "dns_namespace")(_dns1123_label)

    @field_validator("name")
    @classmethod
    def _policy_name(cls, value: str) -> str:
        if not _DNS1123_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"name: {value!r} is not a Kubernetes object name (lowercase letters, digits, '-' and '.')"
            )
        return value

    @field_validator("gateway_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        # The API wants a CIDR (``10.0.12.7/32``, not ``10.0.12.7``) and refused anything else only
        # when the runner first ensured the policy.
        if value is None:
            return None
        try:
            if "/" not in value:
                raise ValueError
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError(f"gateway_cidr: {value!r} is not a CIDR such as 10.0.12.7/32") from None
        return value

    @model_validator(mode="after")
    def _one_gateway_peer(self) -> NetworkPolicyConfig:
        if (self.gateway_pod_labels is None) == (self.gateway_cidr is None):
            raise ValueError("set exactly one of gateway_pod_labels or gateway_cidr")
        return self

    @field_validator("gateway_pod_labels", "dns_pod_labels")
    @classmethod
    def _labels_select_something(
        cls, labels: dict[str, str] | None, info: ValidationInfo
    ) -> dict[str, str] | None:
        # An empty matchLabels selects every pod of the namespace: {} would open the port to all of
        # them (gateway) or be silently replaced by the default (DNS).
        if labels is not None and not labels:
            raise ValueError(f"{info.field_name} must name at least one label: {{}} selects every pod")
        return labels


class PodSecurityConfig(BaseModel):
    """The hardened security context of harness pods (docs/kubernetes.md, "Security context").

    The ids must not be 0: uid/gid 0 is root, the first thing an agent gaming its reward wants."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="false = the template's security contexts and volumes as written (you harden the pod)",
    )
    run_as_user: int = Field(default=1000, description="uid of every container; the image needs no such user")
    run_as_group: int = Field(default=1000, description="primary gid of every container")
    fs_group: int = Field(default=1000, description="group that owns the pod's volumes")
    seed_workspace: bool = Field(
        default=True,
        description="copy the image's workspace into the writable workspace volume (init container, needs sh)",
    )

    @field_validator("run_as_user", "run_as_group", "fs_group")
    @classmethod
    def _not_root(cls, value: int, info: ValidationInfo) -> int:
        if value <= 0:
            raise ValueError(f"{info.field_name} must be a positive id, got {value}: 0 is root")
        return value


class KubernetesRunnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gateway_url: str = Field(
        description="the gateway's root URL as pods reach it, e.g. http://gw.ns.svc:8000"
    )
    network_policy: NetworkPolicyConfig | None = Field(
        description="egress allow-list ensured at start; false = you manage network isolation yourself"
    )
    namespace: str = "default"
    pod_security: PodSecurityConfig = Field(
        default_factory=PodSecurityConfig, description="non-root, no capabilities, read-only image"
    )
    job_template: dict[str, Any] = Field(
        default_factory=dict, description="a Job, Pod, PodTemplate or pod template spec (YAML/JSON as a dict)"
    )
    image: str | None = Field(
        default=None,
        description="harness image; overrides the template's (a task's own image, harness.environment, wins)",
    )
    harness_image: str | None = Field(
        default=None,
        description="with task images: an image holding the harness, copied into each pod by an init "
        "container (harness_paths) and mounted read-only at the same paths; None: the task image has it",
    )
    harness_paths: list[str] = Field(
        default_factory=list,
        description="absolute folders of harness_image to inject (a venv, its Python, .harnesses/)",
    )
    container_name: str | None = Field(default=None, description="harness container in the template")
    workspace_dir: str | None = Field(
        default=None, description="pod-side workspace; default: the container's workingDir, else /workspace"
    )
    # No shared default: two runs in one namespace that both kept "default" shared Job names and
    # labels, so one run's runner deleted the other's running Jobs as superseded attempts of its own
    # (the trainer's rollout ids are deterministic) or refused to launch them.
    run_id: str | None = Field(
        default=None,
        min_length=1,
        description="scopes names and labels: runs never touch each other; the controllers of one run "
        "share it (one cap, a restarted one adopts its Jobs); None: a fresh id per runner",
    )
    name_prefix: str = Field(
        default="hrl", pattern=r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$", description="start of Job names"
    )
    max_concurrent_jobs: int = Field(default=16, ge=1)
    # Every float below is finite (``allow_inf_nan=False``): ``inf`` is valid TOML, passes ``gt=0``,
    # and crashed the manifest builder (math.ceil) or made the loop wait forever.
    poll_interval_s: float = Field(
        default=10.0, gt=0, allow_inf_nan=False, description="period of the full list behind the watch"
    )
    watch_timeout_s: int = Field(default=300, ge=1, description="server-side timeout of one watch request")
    startup_allowance_s: float = Field(
        default=60.0,
        ge=0,
        allow_inf_nan=False,
        description="added to the rollout timeout: the Job's deadline includes pulls",
    )
    ttl_after_finished_s: int = Field(
        default=3600,
        ge=MIN_TTL_AFTER_FINISHED_S,
        description="finished Jobs (their pods' exit statuses and logs) stay this long; at least 60 s, "
        "so the runner reads the outcome before the TTL controller deletes it",
    )
    ephemeral_storage_limit: str = Field(
        default="10Gi",
        description="disk an attempt may use: the harness container's ephemeral-storage limit and the "
        "sizeLimit of its workspace, HOME and /tmp volumes; overrunning it is the policy's failure",
    )
    stuck_pending_s: float = Field(
        default=300.0,
        gt=0,
        allow_inf_nan=False,
        description="a pod stuck unschedulable / pulling this long is an infra failure",
    )
    orphan_grace_s: float = Field(
        default=120.0,
        ge=0,
        allow_inf_nan=False,
        description="after start, wait this long before deleting Jobs nobody launched",
    )
    request_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    max_log_bytes: int = Field(
        default=10 * 1024 * 1024, ge=1, description="the end of the pod log kept as stdout.log"
    )

    @field_validator("network_policy", mode="before")
    @classmethod
    def _opt_out(cls, value: Any) -> Any:
        # TOML has no null: ``network_policy = false`` is how a config file says "no policy of ours"
        # (``true`` is not a policy: the section's fields are needed).
        return None if value is False else value

    _namespace = field_validator("namespace")(_dns1123_label)

    @field_validator("gateway_url")
    @classmethod
    def _gateway_url(cls, value: str) -> str:
        """Every harness's base URLs are built from it: one that is no http(s) URL with a host (a
        bare ``10.96.0.80:8000``) failed every harness's calls, scored as the policy's failures."""
        parsed = urlparse(value)
        try:
            port_ok = parsed.port is None or parsed.port > 0  # .port raises for one not in 0..65535
        except ValueError:
            port_ok = False
        valid = parsed.scheme in ("http", "https") and bool(parsed.hostname) and port_ok
        if not valid or parsed.query or parsed.fragment:
            raise ValueError(
                f"gateway_url: {value!r} must be an http(s) URL of the gateway as pods reach it, "
                "such as http://10.96.0.80:8000"
            )
        return value

    @field_validator("workspace_dir")
    @classmethod
    def _absolute_workspace(cls, value: str | None) -> str | None:
        """The pod-side workspace is a volume's mount path and the container's workingDir: an
        absolute folder other than /. A relative one failed every attempt's container (as INFRA)."""
        if value is None:
            return None
        norm = "/" + posixpath.normpath(value).lstrip("/") if value.startswith("/") else value
        if not value.startswith("/") or norm == "/":
            raise ValueError(f"workspace_dir: {value!r} must be an absolute folder other than /")
        return norm

    @field_validator("ephemeral_storage_limit")
    @classmethod
    def _storage_quantity(cls, value: str) -> str:
        quantity = parse_quantity(value)
        if quantity is None or quantity < 1:
            raise ValueError(f"ephemeral_storage_limit: {value!r} is not a positive quantity such as 10Gi")
        return value

    @field_validator("harness_paths")
    @classmethod
    def _normalized_paths(cls, paths: list[str]) -> list[str]:
        """Absolute folders other than /, normalised (``/opt/..`` is /): the injection mounts each."""
        normalized = []
        for path in paths:
            norm = "/" + posixpath.normpath(path).lstrip("/") if path.startswith("/") else path
            if not path.startswith("/") or norm == "/":
                raise ValueError(f"harness_paths: {path!r} must be an absolute folder other than /")
            if norm in normalized:
                raise ValueError(f"harness_paths: {path!r} names {norm!r} twice")
            normalized.append(norm)
        return normalized

    @field_validator("job_template")
    @classmethod
    def _template_shape(cls, template: dict[str, Any]) -> dict[str, Any]:
        from harnessrl.controller.kubernetes.job_template import normalize_template
        from harnessrl.errors import ConfigError

        try:  # the shape only; the runner validates every field against the client's models
            normalize_template(template)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc
        return template

    @model_validator(mode="after")
    def _harness_container_exists(self) -> KubernetesRunnerConfig:
        from harnessrl.controller.kubernetes.job_template import normalize_template

        if self.container_name is not None:
            containers = normalize_template(self.job_template)["spec"]["template"]["spec"]["containers"]
            names = [c.get("name") for c in containers]
            if self.container_name not in names:
                raise ValueError(
                    f"container_name: job_template has no container named {self.container_name!r}"
                )
        return self

    @model_validator(mode="after")
    def _storage_request_within_limit(self) -> KubernetesRunnerConfig:
        """The template's ephemeral-storage request may not exceed ``ephemeral_storage_limit`` (the
        API refuses the pod). Memory and cpu limits come from ``harness.limits``, another section:
        ``resources.check_requests_within_limits`` checks those with both at hand (``stack.prepare``)."""
        from harnessrl.controller.base import ResourceLimits
        from harnessrl.controller.kubernetes.resources import check_requests_within_limits
        from harnessrl.errors import ConfigError

        try:
            check_requests_within_limits(
                self.job_template,
                ResourceLimits(memory_mb=None, cpus=None),
                container_name=self.container_name,
                ephemeral_storage_limit=self.ephemeral_storage_limit,
            )
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("kubernetes.")) from exc
        return self

    @model_validator(mode="after")
    def _harness_injection(self) -> KubernetesRunnerConfig:
        if self.harness_image and not self.harness_paths:
            raise ValueError("harness_image needs harness_paths: the folders of it the harness runs from")
        return self

    @model_validator(mode="after")
    def _no_host_paths_when_hardened(self) -> KubernetesRunnerConfig:
        from harnessrl.controller.kubernetes.pod_security import refuse_host_path_volumes
        from harnessrl.errors import ConfigError

        if self.pod_security.enabled:
            try:
                refuse_host_path_volumes(self.job_template)
            except ConfigError as exc:
                raise ValueError(str(exc)) from exc
        return self

    @model_validator(mode="after")
    def _gateway_reachable_without_dns(self) -> KubernetesRunnerConfig:
        """With the NetworkPolicy and no DNS, a pod cannot resolve a gateway name: it must be an IP."""
        policy = self.network_policy
        if policy is None or policy.allow_dns:
            return self
        host = urlparse(self.gateway_url).hostname or ""
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(
                f"gateway_url: {self.gateway_url!r} names its host, but network_policy.allow_dns is false "
                "(the default), so pods cannot resolve it: use the gateway Service's cluster IP "
                "(kubectl get svc), or set network_policy.allow_dns = true (pods may then tunnel data "
                "out through DNS lookups)"
            ) from None
        return self
