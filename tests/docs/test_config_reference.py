"""docs/train.md's config reference names every field of the training config under its own section
(it used to list ``[trainer]`` fields under ``[store]`` and miss several); sections it hands to
another page (``as in docs/gateway.md``) are checked against that page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, get_args, get_origin

from pydantic import BaseModel

from harnessrl.config import GatewayConfig
from harnessrl.trainer.config import TrainConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def documented_fields(page: str) -> tuple[dict[str, set[str]], dict[str, str]]:
    """{section: field names in its rows}, {section: the page its fields are delegated to}."""
    text = (DOCS / page).read_text()
    table = text[text.index("## Config reference") :]
    table = table[: table.index("\n\n", table.index("|---|"))]
    fields: dict[str, set[str]] = {}
    delegated: dict[str, str] = {}
    sections: list[str] = []
    for line in table.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0]:
            sections = re.findall(r"`(\w+)`", cells[0])
        names = set(re.findall(r"`(\w+)`", " ".join(cells[1:])))
        other = re.search(r"as in (docs/[\w./-]+\.md)", cells[-1])
        for section in sections:
            fields.setdefault(section, set()).update(names)
            if other and (not cells[1] or "…" in cells[1]):
                delegated[section] = other.group(1)
    return fields, delegated


def _section_models(annotation: object) -> list[type[BaseModel]]:
    """The models a section's annotation allows: one, or each kind of a (discriminated) union."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    if get_origin(annotation) is Annotated:
        return _section_models(get_args(annotation)[0])
    return [model for arg in get_args(annotation) for model in _section_models(arg)]


def test_every_training_config_field_is_in_the_reference_under_its_section():
    fields, delegated = documented_fields("train.md")
    missing = []
    for section, info in TrainConfig.model_fields.items():
        models = _section_models(info.annotation)
        if section in delegated:
            continue
        if not models:
            missing.append(section)
            continue
        missing += [
            f"{section}.{name}"
            for model in models  # each kind of a union ([tasks]: one per type)
            for name in model.model_fields
            if name not in fields.get(section, set())
        ]
    assert missing == []
    # The misfiled rows of the old table: trainer fields are not documented under [store].
    assert not {"autocast", "save_every", "eval_every", "lora"} & fields["store"]


def test_the_gateway_section_is_delegated_to_a_page_that_names_every_field():
    _, delegated = documented_fields("train.md")
    assert delegated.get("gateway") == "docs/gateway.md"
    text = (DOCS / "gateway.md").read_text()
    missing = [name for name in GatewayConfig.model_fields if f"`{name}`" not in text]
    assert missing == []
