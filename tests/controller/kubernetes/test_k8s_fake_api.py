"""The fake API server answers the official client the way a real API server does (shapes, errors,
watch semantics), so the runner tests exercise the client's real code paths."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from tests.controller.kubernetes.k8s_support import FakeKubernetes

JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "demo", "labels": {"app.kubernetes.io/managed-by": "harnessrl", "team": "a"}},
    "spec": {
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "harness", "image": "busybox"}]},
        },
    },
}


@pytest.fixture
def apis(fake_k8s: FakeKubernetes) -> Iterator[tuple[client.BatchV1Api, client.CoreV1Api]]:
    api = client.ApiClient(client.Configuration(host=fake_k8s.url))
    yield client.BatchV1Api(api), client.CoreV1Api(api)
    api.close()


def test_create_get_list_and_errors(fake_k8s, apis) -> None:
    batch, _ = apis
    created = batch.create_namespaced_job("default", JOB)
    assert created.metadata.uid and created.metadata.resource_version
    assert batch.read_namespaced_job("demo", "default").status.active == 1  # the fake job controller ran it
    assert [j.metadata.name for j in batch.list_namespaced_job("default", label_selector="team=a").items] == [
        "demo"
    ]
    assert batch.list_namespaced_job("default", label_selector="team=b").items == []
    assert batch.list_namespaced_job("default", label_selector="team,!missing").items
    with pytest.raises(ApiException) as conflict:
        batch.create_namespaced_job("default", JOB)
    assert conflict.value.status == 409 and json.loads(conflict.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as missing:
        batch.read_namespaced_job("nope", "default")
    body = json.loads(missing.value.body)
    assert missing.value.status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["message"] == 'jobs.batch "nope" not found'
    bad = {**JOB, "metadata": {"name": "Not_Valid"}}
    with pytest.raises(ApiException) as invalid:
        batch.create_namespaced_job("default", bad)
    assert invalid.value.status == 422


def test_delete_propagates_to_pods_and_owned_secrets(fake_k8s, apis) -> None:
    batch, core = apis
    job = batch.create_namespaced_job("default", JOB)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "demo", "uid": job.metadata.uid}
    core.create_namespaced_secret(
        "default", {"metadata": {"name": "demo", "ownerReferences": [owner]}, "stringData": {"k": "v"}}
    )
    assert fake_k8s.secret_value("demo", "k") == "v"
    assert len(core.list_namespaced_pod("default", label_selector="job-name=demo").items) == 1
    batch.delete_namespaced_job("demo", "default", propagation_policy="Background")
    assert fake_k8s.list("pods") == [] and fake_k8s.get("secrets", "demo") is None


def test_watch_streams_events_and_expires(fake_k8s, apis) -> None:
    batch, _ = apis
    start = batch.list_namespaced_job("default").metadata.resource_version
    batch.create_namespaced_job("default", JOB)
    fake_k8s.succeed_job("demo")
    batch.delete_namespaced_job("demo", "default")
    w = watch.Watch()
    events = [
        (e["type"], e["object"].status.succeeded)
        for e in w.stream(batch.list_namespaced_job, "default", resource_version=start, timeout_seconds=1)
    ]
    assert [t for t, _ in events] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    assert events[2][1] == 1
    fake_k8s.compact()
    with pytest.raises(ApiException) as expired:
        list(
            watch.Watch().stream(
                batch.list_namespaced_job, "default", resource_version=start, timeout_seconds=1
            )
        )
    assert expired.value.status == 410
