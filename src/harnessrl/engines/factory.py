"""Build the engine an :class:`~harnessrl.config.EngineConfig` names.

``scripted:FILE`` gives a :class:`~harnessrl.engines.scripted.ScriptedEngine` (no torch);
``vllm:URL[,URL...]`` and ``sglang:URL[,URL...]`` give remote engines (one URL: the engine itself;
several: an :class:`~harnessrl.engines.pool.EnginePool` of them), tokenizing with ``cfg.tokenizer``;
everything else (``tiny``, ``smollm2``, a model folder, a ``.gguf`` file) is resolved to a Hugging
Face folder and served by the embedded engine, whose module (and torch) is imported only then.
"""

from __future__ import annotations

from pathlib import Path

from harnessrl.config import EngineConfig, RemoteServers, ScriptedModel, parse_engine_model
from harnessrl.engines.base import Engine
from harnessrl.errors import ConfigError


def parse_remote_spec(model: str) -> tuple[str, list[str]]:
    """``"vllm:http://a:1,http://b:2"`` -> ``("vllm", ["http://a:1", "http://b:2"])``."""
    try:
        source = parse_engine_model(model)
    except ValueError as exc:
        raise ConfigError(f"engine.model {exc}") from None
    if not isinstance(source, RemoteServers):
        raise ConfigError(f"engine.model {model!r}: expected vllm:URL[,URL...] or sglang:URL[,URL...]")
    return source.kind, list(source.urls)


def _remote_engine(cfg: EngineConfig) -> Engine:
    from harnessrl.engines.pool import EnginePool
    from harnessrl.engines.sglang import SGLangEngine
    from harnessrl.engines.vllm import VLLMEngine
    from harnessrl.tokenizer import PolicyTokenizer

    kind, urls = parse_remote_spec(cfg.model)
    if cfg.tokenizer is None:
        raise ConfigError(f"engine.tokenizer is required with {kind} engines (the gateway tokenizes)")
    if cfg.tokenizer == "tiny":
        from harnessrl.engines.tiny import tiny_model_dir

        tok_dir: Path = tiny_model_dir(cfg.cache_dir, weights=False)
    else:
        tok_dir = Path(cfg.tokenizer)
    tokenizer = PolicyTokenizer.from_dir(tok_dir)
    common = {
        "model": cfg.served_model,
        "context_length": cfg.context_length,
        "request_timeout_s": cfg.request_timeout_s,
    }
    replicas: list[Engine] = [
        VLLMEngine(
            url,
            tokenizer,
            pause_timeout_s=cfg.update_timeout_s,
            request_seeds=cfg.request_seeds,
            **common,  # type: ignore[arg-type]
        )
        if kind == "vllm"
        else SGLangEngine(url, tokenizer, request_seeds=cfg.request_seeds, **common)  # type: ignore[arg-type]
        for url in urls
    ]
    # One URL still goes through a pool: retries and health checks are wanted for one server too.
    return EnginePool(
        replicas,
        max_retries=cfg.max_retries,
        health_interval_s=cfg.health_interval_s,
        update_mode=cfg.update_mode,
    )


def create_engine(cfg: EngineConfig) -> Engine:
    """The engine for ``cfg.model``; call ``await engine.start()`` before generating."""
    source = cfg.source
    if isinstance(source, ScriptedModel):
        from harnessrl.engines.scripted import ScriptedEngine

        return ScriptedEngine(source.path, cache_dir=cfg.cache_dir, context_length=cfg.context_length)
    if isinstance(source, RemoteServers):
        return _remote_engine(cfg)
    from harnessrl.engines.models import resolve_model_dir

    model_dir = resolve_model_dir(cfg.model, cfg.cache_dir)
    from harnessrl.engines.embedded import EmbeddedEngine  # torch is imported here, not before

    return EmbeddedEngine(
        model_dir,
        model_name=cfg.model,
        device=cfg.device,
        dtype=cfg.dtype,
        max_batch_size=cfg.max_batch_size,
        context_length=cfg.context_length,
        seed=cfg.seed,
        prefix_sharing=cfg.prefix_sharing,
        request_seeds=cfg.request_seeds,
    )
