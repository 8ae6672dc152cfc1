"""LoRA for the trainer's policy: checking ``[trainer.lora]`` against the model, wrapping it with
PEFT, and the adapter's files (PEFT's own format, which vLLM, SGLang and PEFT load as they are).

What a LoRA run holds: the base weights (frozen, one copy: the KL penalty's reference is the same
model with its adapters switched off, ``peft.PeftModel.disable_adapter``) and the adapter (the only
trainable parameters, with their AdamW state). A checkpoint folder keeps the adapter under
``adapter/`` (``adapter_config.json`` + ``adapter_model.safetensors``) beside the merged weights
(a Hugging Face folder, so a checkpoint still loads anywhere as is) and the run state; ``--resume``
rebuilds the policy from the run's base weights plus that adapter, never from the merged copy
(fresh adapters on merged weights would hide what was learnt from the adapter and its optimizer).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.errors import ConfigError
from harnessrl.trainer.checkpoint import STATE_FILE, latest_checkpoint

if TYPE_CHECKING:
    import torch

    from harnessrl.trainer.config import LoraSection

#: Where a checkpoint keeps its adapter (PEFT format).
ADAPTER_DIR = "adapter"
#: The one adapter a policy trains (PEFT's default name).
ADAPTER_NAME = "default"
#: How an adapter is written: its low-rank layers alone. PEFT's default ("auto") also writes the
#: whole base weight of an adapted ``lm_head`` (vocabulary x hidden: 2.2 MB beside 9 kB on the tiny
#: model, gigabytes on a large one) into every checkpoint and every adapter a server loads; a resume
#: takes that weight from the base model anyway.
ADAPTER_LAYERS_ONLY = {"save_embedding_layers": False}
#: What the merged export leaves out of a checkpoint folder: the adapter and the run state.
#: What a run's final checkpoint records its step in (``{"step": N}``, beside ``STATE_FILE``'s).
FINAL_FILE = "harnessrl_final.json"
RUN_STATE_FILES = ("trainer_state.pt", STATE_FILE, FINAL_FILE)


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def check_lora(model: torch.nn.Module, lora: LoraSection, section: str = "trainer.lora") -> None:
    """``ConfigError`` naming the field (under ``section``: ``sft.lora`` for ``harnessrl sft``) when
    ``lora`` cannot apply to ``model``: a target module the model does not have (or that is not a
    linear layer), one whose weight is tied to another parameter, or a rank above a target layer's
    smaller side (the low-rank product could not be low rank: ``r`` up to min(in, out))."""
    import torch

    linear = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    leaves = sorted({_leaf(n) for n in linear})
    # Every name of each parameter: a tied one (lm_head with tie_word_embeddings) has several.
    names_of: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(parameter), []).append(name)
    for target in lora.target_modules:
        found = {n: m for n, m in linear.items() if n == target or n.endswith("." + target)}
        if not found:
            others = {_leaf(n) for n, _ in model.named_modules() if n == target or n.endswith("." + target)}
            what = "is not a linear layer" if others else "is not a module of this model"
            raise ConfigError(
                f"{section}.target_modules: {target!r} {what}; its linear layers are {', '.join(leaves)}"
            )
        for name, module in found.items():
            # The adapter changes this layer only, but an engine given the merged weight
            # (``adapted_weights``) writes it into the one tensor both names share: the engine would
            # serve the delta in the tied layer too (e.g. the input embeddings), not the policy trained.
            tied = [n for n in names_of.get(id(module.weight), []) if n != f"{name}.weight"]
            if tied:
                raise ConfigError(
                    f"{section}.target_modules: {target!r} ({name}) shares its weight with {tied[0]} "
                    "(tied embeddings): an adapter on it cannot be served as trained; leave it out"
                )
        matched = list(found.values())
        smallest = min(min(m.in_features, m.out_features) for m in matched)
        if lora.r > smallest:
            raise ConfigError(
                f"{section}.r: {lora.r} is larger than the {target!r} layers allow ({smallest}, the "
                "smaller of their input and output sizes)"
            )


def check_lora_dir(model_dir: str | Path, lora: LoraSection, section: str = "trainer.lora") -> None:
    """``check_lora`` on the model in ``model_dir`` built on the meta device: no weights are read,
    so a run checks its ``[trainer.lora]`` before anything starts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_lora(model, lora, section)


def with_lora(
    model: torch.nn.Module, lora: LoraSection, adapter_dir: str | Path | None = None
) -> torch.nn.Module:
    """``model`` wrapped by PEFT: fresh adapters (B = 0: the policy starts as the base model), or
    the trainable adapter saved in ``adapter_dir`` (a ``--resume``)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    check_lora(model, lora)
    if adapter_dir is not None:
        check_adapter_matches(Path(adapter_dir), lora, model)
        # The saved adapter's settings, with this run's dropout: it may change on --resume
        # (docs/train.md), and PEFT alone takes the saved one (a new dropout was silently ignored).
        saved = LoraConfig.from_pretrained(str(adapter_dir))
        saved.lora_dropout = lora.dropout
        return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True, config=saved)
    return get_peft_model(
        model,
        LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        ),
    )


def check_adapter_matches(adapter_dir: Path, lora: LoraSection, model: torch.nn.Module | None = None) -> None:
    """``ConfigError`` naming the field when a saved adapter (a ``--resume``) was trained with other
    ``[trainer.lora]`` settings than the config's: the run would silently go on with the saved ones.

    ``target_modules`` are compared by the linear layers of ``model`` they select (as a set, without
    ``model``), not as written: PEFT saves them as a set (a repeated name is gone) and rewrites 20 or
    more of them to the shortest suffixes that select the same layers (``q_proj`` for every
    ``model.layers.N.self_attn.q_proj``), so the run's own adapter was refused on every ``--resume``."""
    saved = json.loads((adapter_dir / "adapter_config.json").read_text())
    saved_targets = saved.get("target_modules") or []
    if isinstance(saved_targets, str):  # PEFT also takes one name (or a regex) as a string
        saved_targets = [saved_targets]
    wanted = {"r": lora.r, "alpha": lora.alpha, "target_modules": sorted(set(lora.target_modules))}
    found = {
        "r": saved.get("r"),
        "alpha": saved.get("lora_alpha"),
        "target_modules": sorted(set(saved_targets)),
    }
    if model is not None and _targeted(model, lora.target_modules) == _targeted(model, saved_targets):
        found["target_modules"] = wanted["target_modules"]  # the same layers, however written
    for field, value in wanted.items():
        if found[field] != value:
            raise ConfigError(
                f"trainer.lora.{field}: {value!r}, but the adapter being resumed ({adapter_dir}) was "
                f"trained with {found[field]!r}"
            )


def _targeted(model: torch.nn.Module, targets: list[str]) -> set[str]:
    """The names of ``model``'s linear layers that ``targets`` select (PEFT's rule for a list: the
    whole name, or its end after a dot)."""
    import torch

    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)
    }


def adapted_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapted layers' weights with their adapters merged in (W + scale * B @ A, PEFT's
    ``get_delta_weight``), under the base model's parameter names: what an in-process engine loads
    after a step. New tensors; the model's own weights are not touched (no merge/unmerge round trip,
    which cost ~2x more here)."""
    import torch
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()  # type: ignore[operator]
    out = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                weight = module.get_base_layer().weight
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                out[f"{name}.weight"] = (weight + delta).detach()
    return out


def merged_from_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor], *, adapted_only: bool
) -> dict[str, torch.Tensor]:
    """A PEFT model's full state dict (``model.state_dict()`` names: ``base_model.model.<layer>.base_layer.weight``,
    ``<layer>.lora_A.<adapter>.weight``...) as base-model weights with the adapter merged in (W +
    scale * B @ A): the adapted layers' weights only (``adapted_only``, what ``adapted_weights``
    gives) or every weight (a checkpoint's). For a sharded policy, whose full tensors exist only as
    this gathered dict on rank 0 (``trainer/distributed.py``)."""
    config = model.peft_config[ADAPTER_NAME]  # type: ignore[index]
    scale = config.lora_alpha / (config.r**0.5 if config.use_rslora else config.r)
    out = {}
    for key, value in state.items():
        if ".lora_" in key or (adapted_only and not key.endswith(".base_layer.weight")):
            continue
        if key.endswith(".base_layer.weight"):
            layer = key[: -len(".base_layer.weight")]
            a = state[f"{layer}.lora_A.{ADAPTER_NAME}.weight"]
            b = state[f"{layer}.lora_B.{ADAPTER_NAME}.weight"]
            value = value + scale * (b @ a)
        out[key.removeprefix("base_model.model.").replace(".base_layer", "")] = value
    return out


def save_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Write the adapter in ``state`` (a PEFT model's full state dict, gathered) in PEFT's format,
    as ``model.save_pretrained`` writes it from the model's own tensors."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    # Without the base weights of an adapted lm_head (``save_embedding_layers``: ``ADAPTER_LAYERS_ONLY``).
    adapter = get_peft_model_state_dict(
        model, state_dict=state, adapter_name=ADAPTER_NAME, **ADAPTER_LAYERS_ONLY
    )
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(folder / "adapter_model.safetensors"))
    # A shallow copy: PEFT keeps target_modules as a set and writes it in the set's iteration order; a
    # deep copy rebuilds the set, whose order can differ (a CI run saw the two adapter configs differ).
    config = copy.copy(model.peft_config[ADAPTER_NAME])  # type: ignore[index]
    config.inference_mode = True  # as PeftModel.save_pretrained writes it
    config.save_pretrained(str(folder))


def adapter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the adapter's tensors (what publishing an adapter moves)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)


def export_checkpoint(checkpoint: Path, out: Path, *, merged: bool) -> Path:
    """Write a checkpoint's adapter (PEFT format) or its merged weights (a Hugging Face folder with
    the tokenizer files, without the run state) to ``out``, which must not exist.

    Copied into a hidden folder beside ``out``, renamed to ``out`` once whole: a copy that failed
    (disk full, a stop) left a half-written ``out`` (a truncated ``model.safetensors``) behind, which
    then refused the retry as "already exists", after a traceback."""
    if out.exists():
        raise ConfigError(f"{out}: already exists")
    adapter = checkpoint / ADAPTER_DIR
    if not (checkpoint / "config.json").exists():
        raise ConfigError(f"{checkpoint}: not a harnessrl checkpoint (no config.json)")
    if not merged and not (adapter / "adapter_config.json").exists():
        raise ConfigError(
            f"{checkpoint}: has no adapter (trained without [trainer.lora]); export it with --merged"
        )
    made = [p for p in out.absolute().parents if not p.exists()]  # the folders made for it, deepest first
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        if merged:
            ignore = shutil.ignore_patterns(ADAPTER_DIR, *RUN_STATE_FILES)
            shutil.copytree(checkpoint, partial, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copytree(adapter, partial, dirs_exist_ok=True)
        partial.rename(out)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not isinstance(exc, OSError):  # shutil.Error is one too
            raise
        first = exc.args[0][0][2] if isinstance(exc, shutil.Error) and exc.args[0] else exc
        raise ConfigError(f"{out}: could not be written ({first}); nothing was left there") from exc
    return out


def run_checkpoint(path: Path) -> Path:
    """``path`` itself, or for a run folder its newest checkpoint: ``checkpoints/final``, or
    ``checkpoints/latest`` when that one holds a later step (a ``--resume`` that trained past the
    run's end and stopped before writing a new final: its final is the earlier end's)."""

    # A run folder has a config.json too (the run's own): a checkpoint is one with weights.
    def whole(candidate: Path) -> bool:
        return (candidate / "config.json").exists() and any(candidate.glob("*.safetensors"))

    if whole(path):
        return path
    final, latest = path / "checkpoints" / "final", latest_checkpoint(path)  # or latest.old, mid-swap
    if latest is not None and not whole(latest):
        latest = None
    if whole(final) and not (latest is not None and _step(latest, STATE_FILE) > _step(final, FINAL_FILE)):
        return final
    if latest is not None:
        return latest
    raise ConfigError(f"{path}: neither a checkpoint folder nor a run folder with checkpoints")


def _step(checkpoint: Path, name: str) -> int:
    """The step a checkpoint's ``name`` (``harnessrl_state.json``, ``harnessrl_final.json``) records;
    -1 when it cannot be read."""
    try:
        step = json.loads((checkpoint / name).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return -1
    return step if isinstance(step, int) else -1
