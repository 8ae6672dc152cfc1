"""Per-rollout advantages: properties, plain reference implementations, the Agent Lightning example."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.algorithms import ADVANTAGE_ESTIMATORS, AlgorithmConfig, assign_advantages, rollout_advantages
from harnessrl.errors import InvalidBatch
from harnessrl.schemas import Outcome, Rollout
from harnessrl.trajectory import Sample

EPS = 1e-6
rewards = st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 3))


@st.composite
def grouped_rewards(draw):
    """(rewards_R, group_index_R) with 1..5 groups of 1..6 rollouts, groups interleaved."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    group_index = [g for g, n in enumerate(sizes) for _ in range(n)]
    group_index = draw(st.permutations(group_index))
    return [draw(rewards) for _ in group_index], list(group_index)


# -- plain references, written independently of the implementation ------------------------------
def reference(name: str, rewards_R: list[float], group_index_R: list[int]) -> list[float]:
    groups = {
        g: [r for r, h in zip(rewards_R, group_index_R, strict=True) if h == g] for g in set(group_index_R)
    }
    out = []
    for r, g in zip(rewards_R, group_index_R, strict=True):
        members = groups[g]
        mean = statistics.fmean(members)
        if name == "grpo":
            std = statistics.stdev(members) if len(members) > 1 else 0.0
            out.append((r - mean) / (std + EPS))
        elif name in ("dr_grpo", "reinforce_pp"):
            out.append(r - mean)
        elif name == "rloo":
            others = list(members)
            others.remove(r)
            out.append(r - statistics.fmean(others) if others else 0.0)
    if name == "reinforce_pp":
        m = statistics.fmean(out)
        s = statistics.stdev(out) if len(out) > 1 else 0.0
        out = [(a - m) / (s + EPS) for a in out]
    return out


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@given(data=grouped_rewards())
def test_matches_reference(name, data):
    rewards_R, group_index_R = data
    got = ADVANTAGE_ESTIMATORS[name](rewards_R, group_index_R, EPS)
    assert got == pytest.approx(reference(name, rewards_R, group_index_R), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@given(data=grouped_rewards(), shift=st.floats(-100, 100))
def test_ignores_a_constant_reward_shift(name, data, shift):
    rewards_R, group_index_R = data
    base = ADVANTAGE_ESTIMATORS[name](rewards_R, group_index_R, EPS)
    shifted = ADVANTAGE_ESTIMATORS[name]([r + shift for r in rewards_R], group_index_R, EPS)
    assert shifted == pytest.approx(base, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@given(data=grouped_rewards())
def test_sum_to_zero_per_group(name, data):
    rewards_R, group_index_R = data
    adv = ADVANTAGE_ESTIMATORS[name](rewards_R, group_index_R, EPS)
    for g in set(group_index_R):
        assert math.fsum(a for a, h in zip(adv, group_index_R, strict=True) if h == g) == pytest.approx(
            0.0, abs=1e-6
        )


# -- rollout level ---------------------------------------------------------------------------------
def rollout(
    rid: str, reward: float | None, task: str = "t", outcome: Outcome | None = Outcome.SUCCESS
) -> Rollout:
    return Rollout(rollout_id=rid, api_key="k", task_id=task, step=0, reward=reward, outcome=outcome)


def sample(rid: str, i: int = 0) -> Sample:
    return Sample(rollout_id=rid, input_ids=[1, 2], loss_mask=[0, 1], behaviour_logprobs=[0.0, -1.0], spans=[],
                  sample_index=i)  # fmt: skip


def test_agent_lightning_worked_example():
    """Rewards 1 and 0, first rollout in 3 samples, second in 1: baseline 1/2 (not 3/4 per sample)."""
    rollouts = [rollout("a", 1.0), rollout("b", 0.0)]
    samples = [sample("a", 0), sample("a", 1), sample("a", 2), sample("b", 0)]
    result = rollout_advantages(rollouts, AlgorithmConfig(advantage="dr_grpo"))
    assert result.advantages == {"a": 0.5, "b": -0.5}  # r - 1/2
    with_adv = assign_advantages(samples, result)
    assert [s.advantage for s in with_adv] == [0.5, 0.5, 0.5, -0.5]
    per_sample_baseline = statistics.fmean([1.0, 1.0, 1.0, 0.0])
    assert per_sample_baseline == 0.75 and with_adv[0].advantage != 1.0 - per_sample_baseline


@settings(max_examples=50)
@given(
    st.lists(st.tuples(st.sampled_from("xyz"), rewards, st.integers(1, 4)), min_size=1, max_size=12),
    st.sampled_from(sorted(ADVANTAGE_ESTIMATORS)),
)
def test_every_sample_of_a_rollout_gets_the_rollout_advantage(spec, name):
    rollouts = [rollout(f"r{i}", r, task) for i, (task, r, _) in enumerate(spec)]
    samples = [sample(f"r{i}", j) for i, (_, _, n) in enumerate(spec) for j in range(n)]
    result = rollout_advantages(rollouts, AlgorithmConfig(advantage=name))
    for s in assign_advantages(samples, result):
        assert s.advantage == result.advantages[s.rollout_id]
    assert len(assign_advantages(samples, result)) == len(samples)


@given(st.sampled_from(sorted(ADVANTAGE_ESTIMATORS)), st.floats(-100, 100))
def test_infra_failures_do_not_enter_the_group(name, infra_reward):
    config = AlgorithmConfig(advantage=name)
    clean = rollout_advantages([rollout("a", 1.0), rollout("b", 0.0), rollout("c", 0.0)], config)
    with_infra = rollout_advantages(
        [rollout("a", 1.0), rollout("b", 0.0), rollout("x", infra_reward, outcome=Outcome.INFRA_FAILURE),
         rollout("y", None, outcome=Outcome.INFRA_FAILURE), rollout("c", 0.0)],
        config,
    )  # fmt: skip
    assert with_infra.advantages == clean.advantages
    assert with_infra.excluded == {"x": "infra_failure", "y": "infra_failure"}
    # Counted once, by the step (rollouts/infra_failures), not again here.
    assert not any("infra" in key for key in with_infra.metrics)
    assert with_infra.metrics["rollouts/trained"] == clean.metrics["rollouts/trained"] == 3
    assert assign_advantages([sample("x"), sample("a")], with_infra)[0].rollout_id == "a"


def test_zero_variance_groups_keep_or_drop():
    rollouts = [
        rollout("a", 1.0, "t1"),
        rollout("b", 1.0, "t1"),
        rollout("c", 1.0, "t2"),
        rollout("d", 0.0, "t2"),
    ]
    kept = rollout_advantages(rollouts, AlgorithmConfig(zero_variance_groups="keep"))
    assert kept.advantages["a"] == kept.advantages["b"] == 0.0
    assert kept.metrics["advantage/zero_variance_groups"] == 1
    assert kept.metrics["rollouts/dropped_zero_variance"] == 0 and kept.metrics["rollouts/trained"] == 4
    assert kept.metrics["reward/trained_mean"] == 0.75
    dropped = rollout_advantages(rollouts, AlgorithmConfig(zero_variance_groups="drop"))
    assert set(dropped.advantages) == {"c", "d"}
    assert dropped.excluded == {"a": "zero_variance", "b": "zero_variance"}
    assert dropped.metrics["advantage/zero_variance_groups"] == 1
    assert dropped.metrics["rollouts/dropped_zero_variance"] == 2 and dropped.metrics["rollouts/trained"] == 2
    assert dropped.metrics["reward/trained_mean"] == 0.5  # the mean of what the loss sees, not of all
    assert [s.rollout_id for s in assign_advantages([sample("a"), sample("c")], dropped)] == ["c"]


def test_unscored_rollouts_are_excluded_and_unknown_samples_rejected():
    result = rollout_advantages([rollout("a", 1.0), rollout("b", None, outcome=None)], AlgorithmConfig())
    assert result.excluded == {"b": "no_reward"}
    assert result.metrics["rollouts/no_reward"] == 1
    with pytest.raises(Exception, match="no advantage"):
        assign_advantages([sample("zzz")], result)
    with pytest.raises(Exception, match="twice"):
        rollout_advantages([rollout("a", 1.0), rollout("a", 1.0)], AlgorithmConfig())


def test_groups_are_task_and_step_unless_group_id_is_set():
    a = Rollout(rollout_id="a", api_key="k", task_id="t", step=0, reward=1.0)
    b = Rollout(rollout_id="b", api_key="k", task_id="t", step=1, reward=0.0)  # other step: other group
    result = rollout_advantages([a, b], AlgorithmConfig(advantage="dr_grpo"))
    assert result.advantages == {"a": 0.0, "b": 0.0}
    b2 = b.model_copy(update={"group_id": "g"})
    a2 = a.model_copy(update={"group_id": "g"})
    assert rollout_advantages([a2, b2], AlgorithmConfig(advantage="dr_grpo")).advantages == {
        "a": 0.5,
        "b": -0.5,
    }


def test_config_rejects_unknown_fields():
    with pytest.raises(ValueError):
        AlgorithmConfig(advantage="ppo")
    with pytest.raises(ValueError):
        AlgorithmConfig(clip=0.2)
    with pytest.raises(ValueError):
        AlgorithmConfig(dual_clip=1.1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_a_non_finite_reward_is_refused_naming_the_rollout(name, bad):
    """One NaN or infinite reward made its whole group's advantages NaN (with reinforce_pp the whole
    step's), and the loss with them. The store refuses such rewards; a library user's may hold one."""
    rollouts = [rollout("a", 1.0), rollout("b", 0.0), rollout("c", bad)]
    with pytest.raises(InvalidBatch, match=r"rollout c has reward -?(nan|inf): rewards must be finite"):
        rollout_advantages(rollouts, AlgorithmConfig(advantage=name))
    # An infrastructure failure's reward is never used, whatever it holds.
    infra = rollout("c", bad, outcome=Outcome.INFRA_FAILURE)
    result = rollout_advantages(
        [rollout("a", 1.0), rollout("b", 0.0), infra], AlgorithmConfig(advantage=name)
    )
    assert result.excluded == {"c": "infra_failure"}
    assert all(math.isfinite(a) for a in result.advantages.values())


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_huge_rewards_give_finite_advantages(name):
    """Rewards past 1e154 made grpo and reinforce_pp raise a bare ``OverflowError`` (squaring a
    deviation); past 1e308 a group's sum overflowed, its mean was infinite and every advantage NaN,
    which made every weight NaN at the step's update (later: a refused step)."""
    small = rollout_advantages(
        [rollout("a", 1.0), rollout("b", 1.0), rollout("c", 0.0)], AlgorithmConfig(advantage=name)
    )
    for big in (1e300, 1e308, 1.7e308):
        huge = [rollout("a", big), rollout("b", big), rollout("c", 0.0)]
        result = rollout_advantages(huge, AlgorithmConfig(advantage=name))
        for rid, a in result.advantages.items():
            assert math.isfinite(a)
            scale = big if name in ("dr_grpo", "rloo") else 1.0  # grpo, reinforce_pp: scale-free
            assert a == pytest.approx(small.advantages[rid] * scale, rel=1e-5)  # eps: 1e-6 of a std of 1
        assert math.isfinite(result.metrics["reward/trained_mean"])
        assert result.metrics["reward/trained_mean"] == pytest.approx(big / 3 * 2)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("big", [1e308, -1e308, 1.7e308, 5e-324], ids=["1e308", "-1e308", "1.7e308", "tiny"])
def test_equal_rewards_of_any_size_give_advantages_of_zero(name, big):
    """Equal rewards of 1e308 were refused (their sum overflowed): the group's advantages are 0."""
    equal = [rollout("a", big), rollout("b", big), rollout("c", big)]
    result = rollout_advantages(equal, AlgorithmConfig(advantage=name, zero_variance_groups="keep"))
    assert result.advantages == {"a": 0.0, "b": 0.0, "c": 0.0}
    # ... beside another group: reinforce_pp normalizes over the whole step
    mixed = [*equal, rollout("d", 1.0, task="u"), rollout("e", 0.0, task="u")]
    result = rollout_advantages(mixed, AlgorithmConfig(advantage=name, zero_variance_groups="keep"))
    assert all(math.isfinite(a) for a in result.advantages.values())
    assert result.advantages["a"] == result.advantages["b"] == result.advantages["c"]


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_an_advantage_past_the_float_limit_is_refused_naming_a_rollout(name):
    """Rewards of both signs near the float limit: ``r - mean`` is itself past it, which dr_grpo and
    rloo cannot give as a float (refused, named); grpo and reinforce_pp are scale-free (finite)."""
    apart = [rollout("a", 1.7e308), rollout("b", -1.7e308), rollout("c", -1.7e308)]
    if name in ("dr_grpo", "rloo"):
        with pytest.raises(
            InvalidBatch, match=r"rollout \w \(group t@0, reward .*\) gets advantage .*too far apart"
        ):
            rollout_advantages(apart, AlgorithmConfig(advantage=name))
        return
    result = rollout_advantages(apart, AlgorithmConfig(advantage=name))
    reference_ = rollout_advantages(
        [rollout("a", 1.0), rollout("b", -1.0), rollout("c", -1.0)], AlgorithmConfig(advantage=name)
    )
    for rid, a in result.advantages.items():
        assert a == pytest.approx(reference_.advantages[rid], rel=1e-5)
