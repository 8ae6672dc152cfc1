"""Every init container harnessrl adds carries the harness container's cpu/memory/disk requests and
limits: a ResourceQuota that demands limits (``failed quota: must specify limits.cpu``) checks init
containers too. The seed copy had them; the harness copier of per-task images did not, so on such a
cluster every Job with a task image was refused."""

from __future__ import annotations

from pathlib import Path

from tests.controller.kubernetes.k8s_support import build_launch, job_manifest

from harnessrl.controller.base import ResourceLimits
from harnessrl.controller.kubernetes.harness_injection import HARNESS_CONTAINER
from harnessrl.controller.kubernetes.pod_security import SEED_CONTAINER

TEMPLATE = {
    "spec": {
        "containers": [
            {
                "name": "harness",
                "image": "template:1",
                "resources": {"requests": {"cpu": "250m", "memory": "512Mi", "nvidia.com/gpu": "1"}},
            }
        ]
    }
}


def test_the_harness_copier_gets_the_harness_containers_resources(tmp_path: Path) -> None:
    job = job_manifest(
        TEMPLATE,
        build_launch(
            tmp_path, image="registry.local/swe/toolz:abc", limits=ResourceLimits(memory_mb=1024, cpus=1)
        ),
        harness_image="registry.local/harnessrl/runtime:1",
        harness_paths=["/opt/harnessrl/.venv"],
        ephemeral_storage_limit="10Gi",
    )
    pod = job["spec"]["template"]["spec"]
    inits = {c["name"]: c for c in pod["initContainers"]}
    expected = {
        "requests": {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "0"},
        "limits": {"cpu": "1", "memory": "1024Mi", "ephemeral-storage": "10Gi"},
    }
    assert inits[SEED_CONTAINER]["resources"] == expected  # control: the seed copy always had them
    assert inits[HARNESS_CONTAINER]["resources"] == expected  # the GPU is the harness's alone
