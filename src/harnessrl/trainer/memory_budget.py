"""How much memory a run on this machine's CPU will need, estimated from its config before it starts.

``preflight`` (``run_setup.py``) compares ``estimate_memory`` with the memory the machine has
available (``MemAvailable`` in ``/proc/meminfo``) and refuses a config that cannot fit, naming the
setting that costs most, instead of letting the run be killed by the OOM killer minutes in. No torch:
the estimate reads the model's ``config.json`` (or the built-in shape of ``smollm2``).

The parts, in bytes, for a model of P parameters trained in one process on the CPU (the embedded
engine in the same process):

- trainer state: fp32 weights, gradients and AdamW's two moments, ``16 P`` (LoRA: ``4 P`` for the
  frozen base plus ``16 A`` for the adapters' A parameters, ``r x (in + out)`` per targeted layer:
  at ``r = 128`` on every projection of SmolLM2 that is 0.63 GB, more than the base); a KL reference
  model ``4 P`` more (none with LoRA: the base weights, adapters off);
- engine weights: ``P`` x the engine dtype's size (its own copy, refreshed after every step);
- engine KV cache, at most: ``engine.max_batch_size`` rows x ``engine.context_length`` positions
  (default: the model's own context) x layers x 2 x KV heads x head dim x dtype size. The cache grows
  with the running requests (rows in eights, every row as long as the longest plus ~12%), so this
  is a bound, reached only by that many rows that long;
- activations kept for the backward of one micro-batch: ``trainer.micro_batch_tokens`` x layers x
  ``ACTIVATION_FLOATS_PER_TOKEN_LAYER`` hidden-size multiples, plus the attention probabilities of its
  rows (``row_tokens``^2 x heads per layer); ``trainer.gradient_checkpointing`` keeps one layer's and
  each checkpointed layer's input (``gradient_checkpointing_every``: every Nth layer checkpointed);
- ``PROCESS_OVERHEAD_BYTES`` for the interpreter, torch, the tokenizer, the gateway and the store, and
  ``HARNESS_PROCESS_BYTES`` per concurrent rollout (``controller.concurrency``): measured on the main
  job (PSS, ``benchmarks/cpu_budget.py``), the OpenAI-SDK agent's Python 51 MB, the sandbox
  launcher 8.7 MB, the sandbox's ``init.py`` 4.7 MB and two ``bwrap`` 0.3 MB: 65 MB a rollout.

Measured on the main job (examples/arithmetic, SmolLM2-135M, fp32): see benchmarks/cpu_budget.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.errors import ConfigError
from harnessrl.hardware import resolve_dtype

if TYPE_CHECKING:
    from harnessrl.trainer.config import TrainConfig

GB = 1e9
#: Saved tensors per token and layer of a Llama-style decoder's forward, in units of hidden size:
#: norms' inputs and outputs, q/k/v and their rotated copies, the attention output, the residuals,
#: and the MLP's gate/up/activation products (4 x intermediate, ~10.7 hidden sizes for SmolLM2).
ACTIVATION_FLOATS_PER_TOKEN_LAYER = 22
PROCESS_OVERHEAD_BYTES = int(1.0 * GB)
HARNESS_PROCESS_BYTES = int(0.065 * GB)
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    intermediate: int = 0  # the MLP's inner size (0: unknown)

    @classmethod
    def from_hf_config(cls, c: dict) -> ModelShape:
        """The shape a Llama-style ``config.json`` describes; ``ValueError`` (or ``KeyError`` for a
        missing field) where a size is not a positive integer: no model has such a shape, and
        ``num_attention_heads: 0`` divided by zero here, a traceback at ``harnessrl train``."""
        if not isinstance(c, dict):
            raise ValueError(f"config.json holds {type(c).__name__}, not an object")
        hidden, layers = _size(c, "hidden_size"), _size(c, "num_hidden_layers")
        heads = _size(c, "num_attention_heads")
        kv_heads = _size(c, "num_key_value_heads", heads)
        head_dim = _size(c, "head_dim", hidden // heads)
        vocab, inter = _size(c, "vocab_size"), _size(c, "intermediate_size")
        per_layer = hidden * head_dim * (heads * 2 + kv_heads * 2) + 3 * hidden * inter + 2 * hidden
        embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings", True) else 2)
        return cls(
            params=layers * per_layer + embeddings + hidden,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            vocab=vocab,
            context=_size(c, "max_position_embeddings", 4096),
            intermediate=inter,
        )

    def linear_sides(self, name: str) -> tuple[int, int] | None:
        """(in, out) features of the Llama-style linear layer ``name`` (its last part), and how
        many the model has, as ``(in + out, count)``; None for a name this shape does not know."""
        q, kv, h, i = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden,
            self.intermediate,
        )
        sides = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        if name == "lm_head":
            return h + self.vocab, 1
        if name not in sides or (i == 0 and name in ("gate_proj", "up_proj", "down_proj")):
            return None
        return sum(sides[name]), self.layers

    def adapter_params(self, r: int, targets: list[str]) -> int:
        """Parameters of rank-``r`` adapters on ``targets``: ``r x (in + out)`` per layer. A name
        this shape does not know counts as a square hidden x hidden layer in every decoder layer."""
        total = 0
        for name in set(targets):
            known = self.linear_sides(name.rsplit(".", 1)[-1])
            sides, count = known if known is not None else (2 * self.hidden, self.layers)
            total += r * sides * count
        return total


def _size(c: dict, key: str, default: int | None = None) -> int:
    """``c[key]`` as a positive integer (``default`` where it is missing or null, as transformers
    reads these fields); ``KeyError`` without one, ``ValueError`` for 0, a negative, a fraction, a
    string, a bool or an infinity."""
    value = c.get(key)
    if value is None:
        if default is None:
            raise KeyError(key)
        value = default
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral or value <= 0:
        raise ValueError(f"config.json: {key} = {value!r} is not a positive integer")
    return int(value)


#: SmolLM2-135M-Instruct (its config.json), known before the GGUF is converted.
SMOLLM2 = ModelShape(
    params=134_515_008,
    layers=30,
    hidden=576,
    heads=9,
    kv_heads=3,
    head_dim=64,
    vocab=49152,
    context=8192,
    intermediate=1536,
)


def model_shape(model: str) -> ModelShape | None:
    """The shape of ``engine.model`` when it can be known without loading it: ``smollm2`` or a folder
    with a ``config.json``; None otherwise (no estimate)."""
    if model == "smollm2":
        return SMOLLM2
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        return None
    try:
        return ModelShape.from_hf_config(json.loads(path.read_text()))
    except (OSError, KeyError, TypeError, ValueError):
        # Unreadable, or no shape a model can have: the model's own loading names what is wrong.
        return None


@dataclass(frozen=True)
class MemoryEstimate:
    parts: dict[str, int]  # bytes, by what holds them
    settings: dict[str, str]  # for each part, the setting that sizes it

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        return ", ".join(f"{name} {size / GB:.1f} GB" for name, size in self.parts.items())


def estimate_memory(config: TrainConfig, shape: ModelShape) -> MemoryEstimate:
    """What the run of ``config`` holds at its peak, in bytes (see the module docstring)."""
    t, e = config.trainer, config.engine
    P = shape.params
    # LoRA: the frozen base in fp32, and the adapters' weights, gradients and two AdamW moments.
    trainer = (
        4 * P + 16 * shape.adapter_params(t.lora.r, t.lora.target_modules) if t.lora is not None else 16 * P
    )
    if config.algorithm.kl_coef > 0 and t.lora is None:
        # With LoRA the reference is the policy's own base weights, adapters off: no second copy.
        trainer += 4 * P
    engine_bytes = _DTYPE_BYTES.get(resolve_dtype(e.dtype, e.device), 4)
    context = min(e.context_length or shape.context, shape.context)
    kv = e.max_batch_size * context * shape.layers * 2 * shape.kv_heads * shape.head_dim * engine_bytes
    tokens = t.micro_batch_tokens
    # Checkpointed layers keep their input and, during the backward, one layer's activations at a
    # time; the others keep theirs (``gradient_checkpointing_every``).
    checkpointed = -(-shape.layers // t.gradient_checkpointing_every) if t.gradient_checkpointing else 0
    kept_layers = shape.layers - checkpointed + (1 if checkpointed else 0)
    rows = math.ceil(tokens / max(1, min(t.row_tokens, tokens)))
    row = min(t.row_tokens, tokens)
    activations = (
        tokens * shape.hidden * 4 * checkpointed  # checkpoints
        + kept_layers * tokens * shape.hidden * ACTIVATION_FLOATS_PER_TOKEN_LAYER * 4
        + kept_layers * rows * shape.heads * row * row * 4
    )
    parts = {
        "trainer weights+grads+Adam": trainer,
        "engine weights": P * engine_bytes,
        "engine KV cache": kv,
        "activations": activations,
        "process": PROCESS_OVERHEAD_BYTES + config.controller.concurrency * HARNESS_PROCESS_BYTES,
    }
    settings = {
        "trainer weights+grads+Adam": "engine.model (a smaller model) or trainer.lora",
        "engine weights": "engine.dtype",
        "engine KV cache": (
            f"engine.context_length (now {context}) or engine.max_batch_size (now {e.max_batch_size})"
        ),
        "activations": (
            f"trainer.micro_batch_tokens (now {tokens}), or set trainer.gradient_checkpointing = true"
        ),
        "process": f"controller.concurrency (now {config.controller.concurrency})",
    }
    return MemoryEstimate(parts, settings)


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """``MemAvailable`` in bytes; None where it cannot be read (not Linux)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(config: TrainConfig, available: int | None) -> MemoryEstimate | None:
    """``ConfigError`` when a run of ``config`` on the CPU would need more than ``available`` bytes,
    naming the setting whose part is largest. Skipped for remote engines, GPU trainers, torchrun's
    external controllers, and models whose shape is unknown before loading (returns None then)."""
    if available is None or config.engine.source.kind != "embedded" or config.engine.device != "cpu":
        return None
    if config.trainer.device not in ("cpu", "auto") or config.trainer.controllers == "external":
        return None
    if config.trainer.device == "auto" and Path("/dev/nvidia0").exists():
        return None
    shape = model_shape(config.engine.model)
    if shape is None:
        return None
    estimate = estimate_memory(config, shape)
    if estimate.total > available:
        largest = max(estimate.parts, key=lambda name: estimate.parts[name])
        raise ConfigError(
            f"this run needs about {estimate.total / GB:.1f} GB of memory ({estimate.describe()}) and "
            f"this machine has {available / GB:.1f} GB available: lower {estimate.settings[largest]}"
        )
    return estimate
