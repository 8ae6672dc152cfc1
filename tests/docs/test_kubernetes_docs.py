"""docs/kubernetes.md's configuration example is a section ``harnessrl controller`` accepts (it used
to be ``[controller.kubernetes]``, which the config refuses) and shows every field of the runner's
config, so none is documented nowhere."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import BaseModel

from harnessrl.config import validate_config
from harnessrl.controller.kubernetes.config import (
    KubernetesRunnerConfig,
    NetworkPolicyConfig,
    PodSecurityConfig,
)
from harnessrl.controller.stack import RolloutConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def configuration_example() -> str:
    section = PAGE.read_text().split("## Configuration", 1)[1]
    return section.split("```toml\n", 1)[1].split("```", 1)[0]


def test_the_configuration_example_is_accepted_by_the_controllers_config():
    raw = tomllib.loads(configuration_example())
    assert set(raw) == {"kubernetes"}
    config = validate_config(RolloutConfig, {**raw, "harness": {"command": ["true"]}})
    assert config.kubernetes is not None and config.kubernetes.network_policy is not None


def test_the_configuration_example_shows_every_field():
    # A field shown commented out (``# workspace_dir = ...``) counts: it has no fixed default to show.
    shown = set(re.findall(r"^#? ?(\w+) =", configuration_example(), re.MULTILINE))
    tables = {"network_policy", "pod_security"}
    models: list[type[BaseModel]] = [KubernetesRunnerConfig, NetworkPolicyConfig, PodSecurityConfig]
    # job_template is a whole Job (YAML, shown in the next block), not a line of the example.
    expected = {f for model in models for f in model.model_fields} - tables - {"job_template"}
    assert expected - shown == set()
