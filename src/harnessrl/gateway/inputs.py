"""What a gateway's entry points check before anything is created: the parser names, the engine's
weights, script or tokenizer, a CUDA device this machine lacks, and a store path that cannot be
written. ``run_gateway`` would otherwise find each of them only after it created the store file.

``harnessrl gateway``, ``python -m harnessrl.gateway``, the controller's stack and the trainer call
these; each problem is a ``ConfigError`` naming the field or option (exit 2 at the entry points).
"""

from __future__ import annotations

from pathlib import Path

from harnessrl.config import REMOTE_KINDS, EngineConfig, GatewayConfig, check_cuda_device, check_output_path
from harnessrl.errors import ConfigError


def check_parsers(gateway: GatewayConfig) -> None:
    """``gateway.tool_call_parser`` and ``gateway.reasoning_parser`` name known parsers (or
    ``auto``): checked before a run folder or a store is created, not when the gateway is built
    after them. A ``ConfigError`` naming the field and the known names."""
    from harnessrl.gateway.parsers.reasoning import get_reasoning_parser
    from harnessrl.gateway.parsers.tools import get_tool_parser

    if gateway.tool_call_parser != "auto":
        get_tool_parser(gateway.tool_call_parser)
    if gateway.reasoning_parser != "auto":
        get_reasoning_parser(gateway.reasoning_parser)


def check_gateway_inputs(
    gateway: GatewayConfig,
    engine: EngineConfig,
    store_url: str,
    *,
    model_field: str,
    store_field: str,
    tokenizer_field: str = "engine.tokenizer",
) -> None:
    """Every input ``run_gateway`` reads, checked without creating anything; the ``*_field``
    arguments name where each value came from (``--model`` or ``engine.model``)."""
    from harnessrl.store import sqlite_path

    check_parsers(gateway)
    source = engine.source
    if source.kind == "embedded":
        from harnessrl.engines.models import check_model

        check_model(engine.model, field=model_field)
        check_cuda_device(engine.device, "engine.device")
    elif source.kind == "scripted":
        from harnessrl.engines.scripted import ScriptedEngine

        try:  # reads the script (and its tokenizer) as the gateway will
            ScriptedEngine(source.path, cache_dir=engine.cache_dir, context_length=engine.context_length)
        except ConfigError as exc:
            raise ConfigError(f"{model_field}: {exc}") from exc
    elif source.kind in REMOTE_KINDS and engine.tokenizer not in (None, "tiny"):
        folder = Path(engine.tokenizer).expanduser()
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError(
                f"{tokenizer_field}: {str(folder)!r} has no tokenizer.json (a model folder with a fast tokenizer)"
            )
    try:
        path = sqlite_path(store_url)
    except ConfigError as exc:
        raise ConfigError(f"{store_field}: {exc}") from exc
    if path is not None and path != ":memory:":
        check_output_path(path, store_field)
