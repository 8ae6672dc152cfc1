"""The official client made async: blocking calls in threads, raw JSON in and out, deletes retried.

``KubeApi`` holds the Batch, Core and Networking APIs of one ``ApiClient`` and the runner's request
timeout. Every call asks for the raw body (``_preload_content=False``), so fields a newer server
adds survive; a connection that is refused, reset or timed out (no API answer at all) is an
``UpstreamError``, an answer that refuses is the client's ``ApiException``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harnessrl.controller.kubernetes.api_errors import is_transient
from harnessrl.controller.kubernetes.config import KubernetesRunnerConfig
from harnessrl.errors import ConfigError, UpstreamError

# Tries of one delete the API refuses for a while (429, a 5xx): a Job whose delete failed once at
# shutdown (aclose) was left running to its deadline, with no reconcile pass left to sweep it.
DELETE_TRIES = 4


def default_api_client() -> k8s.ApiClient:
    """In-cluster service account if there is one, else the user's kubeconfig."""
    from kubernetes import config as kube_config

    configuration = k8s.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except kube_config.ConfigException:
        try:
            kube_config.load_kube_config(client_configuration=configuration)
        except Exception as exc:  # the loader raises several unrelated types for "no kubeconfig"
            raise ConfigError(f"no Kubernetes credentials (in-cluster or kubeconfig): {exc}") from exc
    return k8s.ApiClient(configuration)


class KubeApi:
    """The APIs the runner calls, in its namespace, each call bounded by ``request_timeout_s``."""

    def __init__(self, api_client: k8s.ApiClient, config: KubernetesRunnerConfig) -> None:
        self.client = api_client
        self.config = config
        self.batch = k8s.BatchV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.net = k8s.NetworkingV1Api(api_client)

    def _unanswered(self, exc: urllib3.exceptions.HTTPError) -> UpstreamError:
        return UpstreamError(f"Kubernetes API at {self.client.configuration.host}: {exc}")

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        """``fn(*args, **kwargs)`` in a thread; the raw body it answered."""

        def call() -> bytes:
            try:
                resp = fn(
                    *args, _preload_content=False, _request_timeout=self.config.request_timeout_s, **kwargs
                )
            except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out: not an API answer
                raise self._unanswered(exc) from exc
            return resp.data or b""

        return await asyncio.to_thread(call)

    async def json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``fn(*args, **kwargs)`` in a thread; the JSON object it answered (``{}`` for no body)."""
        return json.loads(await self.call(fn, *args, **kwargs) or b"{}")

    async def delete(self, fn: Callable[..., Any], name: str) -> None:
        """Delete ``name`` (gone already is fine); a refusal that passes by itself (429, a 5xx) is
        tried again, ``DELETE_TRIES`` times in all, with a short back-off."""
        for tries in range(1, DELETE_TRIES + 1):
            try:
                await self.json(fn, name, self.config.namespace, propagation_policy="Background")
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if not is_transient(exc) or tries == DELETE_TRIES:
                    raise
            await asyncio.sleep(min(self.config.poll_interval_s, 0.25 * 2**tries))

    async def delete_job(self, name: str) -> None:
        await self.delete(self.batch.delete_namespaced_job, name)

    async def delete_secret(self, name: str) -> None:
        await self.delete(self.core.delete_namespaced_secret, name)

    async def read_log_tail(self, pod: str, container: str | None, limit: int) -> bytes:
        """The last ``limit`` bytes of a container's log. The API's ``limitBytes`` keeps a log's
        head, so the log is read as a stream, holding at most twice ``limit`` at a time."""

        def read_tail() -> bytes:
            try:
                resp = self.core.read_namespaced_pod_log(
                    pod,
                    self.config.namespace,
                    container=container,
                    _preload_content=False,
                    _request_timeout=self.config.request_timeout_s,
                )
                tail = bytearray()
                try:
                    for chunk in resp.stream(1 << 16):
                        tail += chunk
                        if len(tail) > 2 * limit:
                            del tail[:-limit]
                finally:
                    resp.release_conn()
            except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out: not an API answer
                raise self._unanswered(exc) from exc
            return bytes(tail[-limit:])

        return await asyncio.to_thread(read_tail)
