"""Build the engine an :class:`~harnessrl.config.EngineConfig` names.

``scripted:FILE`` gives a :class:`~harnessrl.engines.scripted.ScriptedEngine` (no torch); everything
else (``tiny``, ``smollm2``, a model folder, a ``.gguf`` file) is resolved to a Hugging Face folder
and served by the embedded engine, whose module (and torch) is imported only then.
"""

from __future__ import annotations

from harnessrl.config import EngineConfig
from harnessrl.engines.base import Engine

SCRIPTED_PREFIX = "scripted:"


def create_engine(cfg: EngineConfig) -> Engine:
    """The engine for ``cfg.model``; call ``await engine.start()`` before generating."""
    if cfg.model.startswith(SCRIPTED_PREFIX):
        from harnessrl.engines.scripted import ScriptedEngine

        return ScriptedEngine(
            cfg.model[len(SCRIPTED_PREFIX) :], cache_dir=cfg.cache_dir, context_length=cfg.context_length
        )
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
    )
