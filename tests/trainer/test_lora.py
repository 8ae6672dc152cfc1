"""LoRA in the trainer (``[trainer.lora]``, ``trainer/lora.py``): a bad section is a config error
naming its field before anything starts; the KL reference is the base weights with the adapters
switched off (no second copy, the same steps as a separate copy); checkpoints hold the adapter in
PEFT's format and resume from base + adapter exactly; ``harnessrl export`` writes the adapter or the
merged Hugging Face folder."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.config import load_raw_config, validate_config
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.errors import ConfigError
from harnessrl.trainer.checkpoint import TrainState, write_checkpoint
from harnessrl.trainer.config import LoraSection, OptimizerConfig, TrainConfig
from harnessrl.trainer.lora import adapted_weights, check_lora_dir, merged_from_state, save_adapter_state
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trainer.run import Trainer
from harnessrl.trajectory import Sample, SampledSpan

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"
LORA = LoraSection(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


def config(*overrides: str) -> TrainConfig:
    return validate_config(TrainConfig, load_raw_config(str(CONFIG), list(overrides)))


def samples(step: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(step)
    out = []
    for r, advantage in enumerate([1.0, -0.5, 0.7]):
        ids = torch.randint(5, 4096, (14,), generator=gen).tolist()
        mask = [0] * 5 + [1] * 9
        out.append(
            Sample(
                rollout_id=f"s{step}-r{r}",
                input_ids=ids,
                loss_mask=mask,
                behaviour_logprobs=[-8.3 if m else 0.0 for m in mask],
                spans=[SampledSpan(5, 14, 0, 0)],
                advantage=advantage,
            )
        )
    return out


def new_policy(model_dir: Path | None = None, **kwargs) -> TrainablePolicy:
    kwargs.setdefault("lora", LORA)
    return TrainablePolicy(
        model_dir or tiny_model_dir(), optimizer=OptimizerConfig(lr=1e-2), total_steps=4, **kwargs
    )


def step(policy: TrainablePolicy, s: int, kl_coef: float = 0.0) -> dict[str, float]:
    return policy.train_step(
        samples(s), AlgorithmConfig(kl_coef=kl_coef), temperature=1.0, micro_batch_tokens=64
    )


PROMPT, ANSWER = [5, 9, 33, 120, 7], [44, 45, 46, 47]


# -- bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lora", "field", "detail"),
    [
        (LoraSection(target_modules=["q_proj", "qkv_proj"]), "trainer.lora.target_modules", "not a module"),
        (LoraSection(target_modules=["norm"]), "trainer.lora.target_modules", "not a linear layer"),
        # k_proj is 128 -> 64 on the tiny model (2 KV heads of 32)
        (LoraSection(r=65, target_modules=["q_proj", "k_proj"]), "trainer.lora.r", "'k_proj'.*\\(64"),
    ],
)
def test_a_lora_section_the_model_cannot_take_is_a_config_error_naming_the_field(lora, field, detail):
    with pytest.raises(ConfigError, match=f"^{field}: .*{detail}"):
        check_lora_dir(tiny_model_dir(), lora)
    with pytest.raises(ConfigError, match=f"^{field}: "):  # also building the policy directly
        TrainablePolicy(tiny_model_dir(), lora=lora)


def tied_model_dir(tmp_path: Path) -> Path:
    """The tiny model with tied embeddings (as SmolLM2's): ``lm_head.weight`` is ``embed_tokens.weight``."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "tied"
    shutil.copytree(tiny_model_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = load_file(str(folder / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_lora_on_a_layer_whose_weight_is_tied_is_a_config_error_naming_target_modules(tmp_path):
    """An engine loads the adapted ``lm_head.weight`` into the one tensor it shares with the input
    embeddings, so it would serve the delta in both while the trainer applies it to the head only
    (measured: served and trained log-probs 0.33 apart). Refused before anything runs."""
    tied = tied_model_dir(tmp_path)
    lora = LoraSection(r=4, target_modules=["q_proj", "lm_head"])
    pattern = (
        r"^trainer\.lora\.target_modules: 'lm_head' \(lm_head\) shares its weight with model\.embed_tokens"
    )
    with pytest.raises(ConfigError, match=pattern):
        check_lora_dir(tied, lora)
    with pytest.raises(ConfigError, match=pattern):  # also building the policy directly
        TrainablePolicy(tied, lora=lora)
    check_lora_dir(tied, LoraSection(r=4, target_modules=["q_proj"]))  # untied layers of it are fine
    check_lora_dir(tiny_model_dir(), lora)  # and so is an lm_head of its own


def test_the_largest_rank_a_layer_allows_is_accepted():
    check_lora_dir(tiny_model_dir(), LoraSection(r=64, target_modules=["k_proj"]))


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("trainer.lora.r=0", "trainer.lora.r"),
        ("trainer.lora.target_modules=[]", "trainer.lora.target_modules"),
    ],
)
def test_rank_zero_and_no_target_modules_are_refused_when_the_config_is_read(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config("trainer.lora.alpha=8", override)


def test_lora_with_gateways_started_elsewhere_is_refused_naming_trainer_lora():
    with pytest.raises(ConfigError, match=r"trainer\.lora: not supported with trainer\.gateway_url"):
        config(
            "trainer.lora.r=4",
            "trainer.gateway_url=http://127.0.0.1:9",
            "trainer.controllers=external",
            "store.url=postgresql://127.0.0.1:9/x",
            "engine.model=vllm:http://127.0.0.1:9",
            "trainer.model=tiny",
            "gateway.admin_key=k",
        )


def test_a_run_checks_its_lora_section_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = Trainer(config("trainer.lora.target_modules=['nope']"), run_dir, base_dir=CONFIG.parent)
    import asyncio

    with pytest.raises(ConfigError, match=r"^trainer\.lora\.target_modules: 'nope'"):
        asyncio.run(trainer.run())
    assert list(run_dir.iterdir()) == []  # no store, no metrics, no gateway: nothing started


# -- the KL reference ------------------------------------------------------------------------------------
def test_the_kl_reference_is_the_base_weights_with_adapters_off_and_no_second_copy(tmp_path):
    copy = tmp_path / "base"
    shutil.copytree(tiny_model_dir(), copy)
    shared = new_policy(reference_dir=tiny_model_dir())
    separate = new_policy(reference_dir=copy)  # another folder: a copy is loaded, as without LoRA
    assert shared.reference is shared.model
    assert separate.reference is not None and separate.reference is not separate.model
    for s in range(3):
        a, b = step(shared, s, kl_coef=0.5), step(separate, s, kl_coef=0.5)
        assert a["policy/kl_ref"] == pytest.approx(b["policy/kl_ref"], rel=1e-5, abs=1e-9)
        assert a["policy/loss"] == pytest.approx(b["policy/loss"], rel=1e-5)
    assert a["policy/kl_ref"] > 1e-6  # the adapters moved the policy away from its base
    # and the adapters are back on after the reference pass
    torch.testing.assert_close(
        torch.tensor(shared.response_logprobs(PROMPT, ANSWER)),
        torch.tensor(separate.response_logprobs(PROMPT, ANSWER)),
        atol=1e-5,
        rtol=0,
    )


# -- checkpoints, resume, export -------------------------------------------------------------------------
def test_a_checkpoint_holds_the_adapter_and_resumes_exactly_from_base_plus_adapter(tmp_path):
    policy = new_policy()
    step(policy, 0)
    step(policy, 1)
    folder = policy.save_checkpoint(tmp_path / "ckpt")
    assert {p.name for p in (folder / "adapter").iterdir()} >= {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    resumed = new_policy(adapter_dir=folder / "adapter")
    resumed.load_trainer_state(folder)
    assert resumed.response_logprobs(PROMPT, ANSWER) == pytest.approx(
        policy.response_logprobs(PROMPT, ANSWER), abs=1e-6
    )
    # The next step is the one the first policy takes: same adapter, same AdamW state.
    step(policy, 2)
    step(resumed, 2)
    ours = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    for name, p in resumed.model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p, ours[name], atol=1e-6, rtol=0)
    # A fresh adapter on the merged weights (what --resume did before) would lose the AdamW state.
    assert len(resumed.optimizer.state) == len(ours)


def dropout_model_dir(tmp_path: Path) -> Path:
    """The tiny model with attention dropout: a full fine-tune that draws dropout masks too."""
    folder = tmp_path / "dropout"
    shutil.copytree(tiny_model_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.3}))
    return folder


@pytest.mark.parametrize("lora", [LORA.model_copy(update={"dropout": 0.3}), None], ids=["lora", "full"])
def test_a_resumed_step_draws_the_dropout_masks_the_run_would_have_drawn(tmp_path, lora):
    """The checkpoint keeps torch's generator state: a resumed policy, seeded afresh, drew the first
    steps' dropout masks again (measured: weights 1.5e-2 from the uninterrupted run's)."""
    model_dir = tiny_model_dir() if lora is not None else dropout_model_dir(tmp_path)

    def build(**kwargs) -> TrainablePolicy:
        return TrainablePolicy(model_dir, optimizer=OptimizerConfig(lr=1e-2), lora=lora, **kwargs)

    # One after the other: every policy draws from torch's one generator (each seeds it when built).
    straight = build()
    for s in range(3):
        step(straight, s)
    interrupted = build()
    for s in range(2):
        step(interrupted, s)
    folder = interrupted.save_checkpoint(tmp_path / "ckpt")
    resumed = build(adapter_dir=folder / "adapter" if lora is not None else None)
    if lora is None:  # a full fine-tune resumes from the checkpoint's weights
        resumed = TrainablePolicy(folder, optimizer=OptimizerConfig(lr=1e-2))
    resumed.load_trainer_state(folder)
    step(resumed, 2)
    ours = dict(straight.model.named_parameters())
    for name, p in resumed.model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(
                p, ours[name], atol=1e-6, rtol=0, msg=lambda m, name=name: f"{name}: {m}"
            )


def test_starting_the_embedded_engine_leaves_the_restored_generator_state_alone():
    """A resumed run restores the generator state (``_build_policy``) before its fleet starts the
    embedded engine, which seeds torch for its own load: that seed reset the trainer's generator, so
    the resumed steps drew the masks of the run's first steps again."""
    import asyncio

    from harnessrl.engines.embedded import EmbeddedEngine

    torch.manual_seed(1234)
    restored = torch.get_rng_state()
    engine = EmbeddedEngine(tiny_model_dir(), max_batch_size=2, seed=0)

    async def run() -> None:
        await engine.start()
        await engine.aclose()

    asyncio.run(run())
    assert torch.equal(torch.get_rng_state(), restored)


def test_a_checkpoint_without_the_generator_state_still_resumes(tmp_path):
    """Checkpoints written before the generator state was saved load as before."""
    policy = new_policy()
    step(policy, 0)
    folder = policy.save_checkpoint(tmp_path / "ckpt")
    state = torch.load(folder / "trainer_state.pt", weights_only=False)
    del state["rng"]
    torch.save(state, folder / "trainer_state.pt")
    resumed = new_policy(adapter_dir=folder / "adapter")
    resumed.load_trainer_state(folder)
    assert resumed.scheduler.last_epoch == policy.scheduler.last_epoch == 1


def test_writing_a_checkpoint_leaves_the_weights_being_trained_bit_for_bit(tmp_path):
    """The merged weights a checkpoint (and the engine) gets are computed beside the model: merging
    the adapter into the live weights and out again moved them by a rounding error each time, and a
    resumed run then differed from the run it resumed (a test below failed so)."""
    policy = new_policy()
    step(policy, 0)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    folder = policy.save_checkpoint(tmp_path / "ckpt")
    for name, p in policy.model.named_parameters():
        assert torch.equal(p, before[name]), name
    # Control: the saved weights of the adapted layers are the merged ones, not the base ones.
    from safetensors.torch import load_file

    saved = load_file(str(folder / "model.safetensors"))
    merged = adapted_weights(policy.model)
    assert merged and all(torch.equal(saved[key], value) for key, value in merged.items())
    base = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p for n, p in before.items()}
    assert not all(torch.equal(saved[key], base[key]) for key in merged)


def test_a_resumed_lora_run_builds_its_policy_from_the_base_weights_and_the_checkpoint_adapter(tmp_path):
    cfg = config("trainer.lora.r=4", "trainer.lora.alpha=8", "algorithm.kl_coef=0.05")
    run_dir = tmp_path / "run"
    policy = TrainablePolicy.from_config(cfg, tiny_model_dir())
    step(policy, 0)
    write_checkpoint(policy, TrainState(step=1), run_dir, save_every=0)
    trainer = Trainer(cfg, run_dir, resume=True, base_dir=CONFIG.parent)
    resumed = trainer._build_policy()
    assert isinstance(resumed, TrainablePolicy)
    assert resumed.model_dir == tiny_model_dir()  # the base, not the checkpoint's merged weights
    assert resumed.reference is resumed.model  # the KL anchor is still the base: no second copy
    assert resumed.response_logprobs(PROMPT, ANSWER) == pytest.approx(
        policy.response_logprobs(PROMPT, ANSWER), abs=1e-6
    )


def test_resuming_an_adapter_with_other_lora_settings_is_a_config_error_naming_the_field(tmp_path):
    new_policy().save_adapter(tmp_path / "adapter")
    with pytest.raises(ConfigError, match=r"^trainer\.lora\.r: 8, but the adapter being resumed .* with 4"):
        TrainablePolicy(
            tiny_model_dir(), lora=LORA.model_copy(update={"r": 8}), adapter_dir=tmp_path / "adapter"
        )
    other = LORA.model_copy(update={"target_modules": ["q_proj"]})
    with pytest.raises(ConfigError, match=r"^trainer\.lora\.target_modules: "):
        TrainablePolicy(tiny_model_dir(), lora=other, adapter_dir=tmp_path / "adapter")


@pytest.mark.parametrize(("saved", "now"), [(0.0, 0.3), (0.3, 0.0)])
def test_a_resumed_adapter_trains_with_this_runs_dropout(tmp_path, saved, now):
    """``dropout`` may change on ``--resume`` (docs/train.md), but PEFT built the resumed adapter with
    the saved adapter's dropout: the new value was silently ignored."""

    def dropouts(policy: TrainablePolicy) -> set[float]:
        return {
            m.p if isinstance(m, torch.nn.Dropout) else 0.0
            for name, m in policy.model.named_modules()
            if ".lora_dropout." in name
        }

    first = new_policy(lora=LORA.model_copy(update={"dropout": saved}))
    assert dropouts(first) == {saved}  # control: a fresh adapter has the configured dropout
    step(first, 0)
    folder = first.save_checkpoint(tmp_path / "ckpt")
    resumed = new_policy(lora=LORA.model_copy(update={"dropout": now}), adapter_dir=folder / "adapter")
    assert dropouts(resumed) == {now}
    assert resumed.response_logprobs(PROMPT, ANSWER) == pytest.approx(  # the trained adapter, loaded
        first.response_logprobs(PROMPT, ANSWER), abs=1e-6
    )
    assert any(p.requires_grad for p in resumed.model.parameters())  # and trainable
    resumed.save_adapter(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "adapter_config.json").read_text())["lora_dropout"] == now


def test_a_gathered_state_dict_gives_what_the_model_itself_gives(tmp_path):
    """What a sharded policy has on rank 0 is the PEFT model's whole state dict, gathered: merged
    from it, the engine's weights, the checkpoint's weights and the adapter equal the one process's."""
    from safetensors.torch import load_file

    policy = new_policy()
    step(policy, 0)
    step(policy, 1)  # B is no longer 0: the merge really adds something
    state = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    engine = merged_from_state(policy.model, state, adapted_only=True)
    want = policy.engine_state_dict()
    layers = policy.model.get_base_model().config.num_hidden_layers
    assert set(engine) == set(want) and len(want) == len(LORA.target_modules) * layers
    for name in want:
        torch.testing.assert_close(engine[name], want[name], atol=1e-6, rtol=1e-6, msg=name)
    full = merged_from_state(policy.model, state, adapted_only=False)
    merged = copy.deepcopy(policy.model).merge_and_unload().state_dict()  # peft's own merge, on a copy
    assert set(full) == set(merged)
    for name in merged:
        torch.testing.assert_close(full[name], merged[name], atol=1e-6, rtol=1e-6, msg=name)
    base = {k.removeprefix("base_model.model.").replace(".base_layer", ""): v for k, v in state.items()}
    moved = max(float((want[k] - base[k]).abs().max()) for k in want)
    assert moved > 1e-4  # control: the adapters changed the weights they merge into

    save_adapter_state(policy.model, state, tmp_path / "gathered")
    policy.save_adapter(tmp_path / "own")
    ours, theirs = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("own", "gathered"))
    assert set(ours) == set(theirs) and ours
    for name in ours:
        torch.testing.assert_close(theirs[name], ours[name], atol=0, rtol=0, msg=name)
    config = json.loads((tmp_path / "gathered" / "adapter_config.json").read_text())
    assert config["r"] == LORA.r and config == json.loads(
        (tmp_path / "own" / "adapter_config.json").read_text()
    )


def test_save_adapter_writes_nothing_without_lora(tmp_path):
    assert TrainablePolicy(tiny_model_dir()).save_adapter(tmp_path / "a") is False
    assert not (tmp_path / "a").exists()


def harnessrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harnessrl", *args], capture_output=True, text=True, timeout=300
    )


def test_export_writes_the_adapter_or_the_merged_model(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy = new_policy()
    step(policy, 0)
    run_dir = tmp_path / "run"
    policy.save_checkpoint(run_dir / "checkpoints" / "final", with_optimizer=False)
    (run_dir / "config.json").write_text("{}")  # a run folder holds its config.json too
    expected = policy.response_logprobs(PROMPT, ANSWER)

    def logprobs(model: torch.nn.Module) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT + ANSWER])).logits[0].log_softmax(-1)
        return [logits[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(ANSWER)]

    done = harnessrl("export", str(run_dir), str(tmp_path / "adapter"))  # a run folder: its final one
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()))
    assert logprobs(PeftModel.from_pretrained(base, str(tmp_path / "adapter"))) == pytest.approx(
        expected, abs=1e-5
    )

    done = harnessrl("export", str(run_dir / "checkpoints" / "final"), str(tmp_path / "merged"), "--merged")
    assert done.returncode == 0, done.stderr
    merged = tmp_path / "merged"
    assert not (merged / "adapter").exists() and (merged / "tokenizer.json").exists()
    assert logprobs(AutoModelForCausalLM.from_pretrained(str(merged))) == pytest.approx(expected, abs=1e-5)

    again = harnessrl("export", str(run_dir), str(tmp_path / "adapter"))
    assert again.returncode == 2 and "already exists" in again.stderr
    full = TrainablePolicy(tiny_model_dir()).save_checkpoint(tmp_path / "full", with_optimizer=False)
    refused = harnessrl("export", str(full), str(tmp_path / "nothing"))
    assert refused.returncode == 2 and "has no adapter" in refused.stderr and "--merged" in refused.stderr


# -- the embedded engine ---------------------------------------------------------------------------------
def test_the_embedded_engine_applies_the_adapted_layers_in_place_and_samples_the_trained_policy(tmp_path):
    """The in-process engine gets only the adapted layers' merged weights (nothing else changes);
    its logprobs then equal the trainer's (base + adapter) to the embedded engine's usual 1e-4, and
    before the update (control) they are the base model's."""
    import asyncio

    from harnessrl.engines.base import SamplingParams, each_sample
    from harnessrl.engines.embedded import EmbeddedEngine
    from harnessrl.trainer.fleet_gateway import load_weights

    policy = new_policy()
    base = TrainablePolicy(tiny_model_dir())
    for s in range(3):
        step(policy, s)
    published = policy.engine_state_dict()
    assert published and all(
        k.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")) for k in published
    )
    engine = EmbeddedEngine(tiny_model_dir(), max_batch_size=4, seed=0)

    async def run() -> tuple[list, list]:
        await engine.start()
        try:
            params = SamplingParams(max_tokens=10, temperature=1.0)
            before = [s async for s in each_sample(engine.generate(PROMPT, params))]
            await load_weights(engine.update_weights, engine.shares_weights, 1, policy, tmp_path)
            after = [s async for s in each_sample(engine.generate(PROMPT, params))]
            return before, after
        finally:
            await engine.aclose()

    before, after = asyncio.run(run())
    assert engine.policy_version == 1 and list(tmp_path.iterdir()) == []  # in place: no folder
    for samples, model in ((before, base), (after, policy)):
        ids = [s.token_id for s in samples]
        want = torch.tensor(model.response_logprobs(PROMPT, ids))
        torch.testing.assert_close(torch.tensor([s.logprob for s in samples]), want, atol=1e-4, rtol=0)
    ids = [s.token_id for s in after]  # control: the trained policy is not the base one
    assert (
        max(
            abs(a - b)
            for a, b in zip(
                policy.response_logprobs(PROMPT, ids), base.response_logprobs(PROMPT, ids), strict=True
            )
        )
        > 1e-2
    )


# -- a whole run -----------------------------------------------------------------------------------------
@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="the sandbox needs root here")
def test_a_lora_run_with_a_kl_penalty_trains_resumes_and_exports(tmp_path):
    """``harnessrl train`` of the tiny example with ``[trainer.lora]`` and ``kl_coef`` on the embedded
    engine, one step, then ``--resume`` for a second (the engine, started on the checkpoint's merged
    weights, gets the adapted layers again), then ``harnessrl export`` of the run."""
    run_dir = tmp_path / "run"
    common = [
        "--set",
        "metrics.progress=false",
        "--set",
        "trainer.tasks_per_step=2",
        "--set",
        "trainer.group_size=4",
    ]
    first = harnessrl(
        "train", str(CONFIG), "--set", f"run.dir={run_dir}", *common,
        "--set", "trainer.steps=1", "--set", "trainer.lora.r=4", "--set", "trainer.lora.alpha=8",
        "--set", "algorithm.kl_coef=0.05",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    adapter_1 = (run_dir / "checkpoints" / "latest" / "adapter" / "adapter_model.safetensors").read_bytes()
    again = harnessrl("train", "--resume", str(run_dir), *common, "--set", "trainer.steps=2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["steps"] == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "policy/kl_ref" in r] == [1, 2]
    adapter_2 = (run_dir / "checkpoints" / "latest" / "adapter" / "adapter_model.safetensors").read_bytes()
    assert adapter_2 != adapter_1  # the resumed step trained the adapter further
    exported = harnessrl("export", str(run_dir), str(tmp_path / "out"))
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "out" / "adapter_model.safetensors").read_bytes() == adapter_2


def test_the_served_weights_check_reads_the_policy_without_dropout():
    """``response_logprobs`` (the served-weights check compares an engine's log-probs with it) ran in
    train mode: with LoRA dropout each call gave other log-probs (-8.23 and -10.87 for one token) and
    drew from the generator a resumed run restores. An engine serves the weights without dropout."""
    policy = TrainablePolicy(tiny_model_dir(), lora=LORA.model_copy(update={"dropout": 0.5}))
    before = torch.get_rng_state()
    first = policy.response_logprobs(PROMPT, ANSWER)
    assert policy.response_logprobs(PROMPT, ANSWER) == first
    assert torch.equal(torch.get_rng_state(), before)  # no mask drawn
    assert policy.model.training  # left as it was, for the next step
