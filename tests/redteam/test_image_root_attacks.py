"""Red team with an image root: every attack of ``attacker.py`` fails when the sandbox's root is a task's
image instead of the host's system folders (``docs/environments.md``), exactly as it does over the
host root (``test_sandbox_attacks.py``, whose ``sandbox = "none"`` run is the control for both: there
each attack works, which shows each probe notices success). The image is the example's
``swe/inflection`` (Debian with Python, git and curl, so the shell and curl attacks run for real).
"""

from __future__ import annotations

import pytest
from tests.environments.image_support import environment_toml, environments, needs_images
from tests.redteam.test_sandbox_attacks import (
    STOPPED_BY_THE_SANDBOX,
    STOPPED_ELSEWHERE,
    run_attacker,
    signals,  # noqa: F401  (the fixture)
)

pytestmark = [needs_images, pytest.mark.slow]
IMAGE = "swe/inflection"


def test_every_attack_fails_inside_the_sandbox_with_an_image_root(tmp_path, signals):  # noqa: F811
    root = environments().root(IMAGE, where="the red team's image")
    run = run_attacker(
        tmp_path,
        "bwrap",
        signals,
        extra_config="\n" + environment_toml(field="image_name"),
        task_fields={"image_name": IMAGE},
    )
    results = run["results"]
    assert set(results) == STOPPED_BY_THE_SANDBOX | STOPPED_ELSEWHERE | {"signal_the_test_process"}
    succeeded = {name: r["evidence"] for name, r in results.items() if r["succeeded"]}
    succeeded.pop("signal_the_test_process", None)  # "sent" means nothing: what arrived is counted below
    assert succeeded == {}, f"attacks that worked inside the sandbox over an image: {succeeded}"
    assert run["signals"] == 0 and run["listener"] == 0 and run["survivors"] == []
    assert run["hidden_intact"] and run["planted"] == []
    assert "canary seen" in results["answer_in_harness_task"]["evidence"]  # the probe itself works
    rollout = run["rollout"]
    assert rollout.metadata["environment"]["image_id"] == root.image_id[:12]  # it ran on the image
    assert rollout.metadata["reward_before_audit"] == 0.0 and rollout.reward == 0.0
    assert "tamper_finished" not in rollout.flags
    # The attacks that write into system folders met the image's, read-only: not the host's.
    assert (
        "Read-only" in results["write_usr_bin"]["evidence"]
        or "denied" in results["write_usr_bin"]["evidence"]
    )
