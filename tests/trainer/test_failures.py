"""``trainer.failures``: a step stops the run only when every rollout failed alike before the policy
was sampled; anything the policy could have caused never matches."""

from __future__ import annotations

from types import SimpleNamespace

from harnessrl.schemas import Outcome, Rollout, RolloutStatus
from harnessrl.trainer.failures import common_failure, failure_signature


def rollout(k: int, *, reward: float = 0.0, code: int = 1, tail: str = "", attempt: int = 0) -> Rollout:
    rid = f"g000003-r{k}"
    return Rollout(
        rollout_id=rid,
        api_key="k",
        group_id="g000003",
        status=RolloutStatus.FINISHED,
        outcome=Outcome.POLICY_FAILURE if code else Outcome.SUCCESS,
        reward=reward,
        attempt=attempt,
        metadata={
            "exit": {"kind": "exited", "code": code},
            "log_dir": f"/runs/x/rollouts/{rid}/attempt-{attempt}",
            "stderr_tail": tail or f"python: can't open file '/runs/x/rollouts/{rid}/attempt-{attempt}/a.py'",
        },
    )


def group(rollouts: list[Rollout], calls: dict[str, list] | None = None) -> SimpleNamespace:
    return SimpleNamespace(rollouts=tuple(rollouts), calls=calls or {})


def test_the_same_failure_without_a_model_call_is_one_reason_with_the_rollouts_own_paths_masked():
    reason = common_failure([group([rollout(0), rollout(1)]), group([rollout(2)])])
    assert reason is not None
    assert reason.startswith("all 3 rollouts of the step failed the same way")
    assert "exit code 1" in reason and "'<attempt>/a.py'" in reason


def test_a_model_call_a_reward_or_a_different_failure_is_never_a_common_failure():
    one_called = {"g000003-r1": [SimpleNamespace(attempt=0)]}
    assert common_failure([group([rollout(0), rollout(1)], one_called)]) is None
    # A call of an earlier attempt does not count: the last attempt is what ended the rollout.
    earlier = {"g000003-r1": [SimpleNamespace(attempt=0)]}
    assert common_failure([group([rollout(0, attempt=1), rollout(1, attempt=1)], earlier)]) is not None
    assert common_failure([group([rollout(0), rollout(1, reward=0.5)])]) is None
    assert common_failure([group([rollout(0, code=1), rollout(1, code=2)])]) is None
    assert (
        common_failure([group([rollout(0, tail="ImportError: a"), rollout(1, tail="ImportError: b")])])
        is None
    )
    assert common_failure([group([rollout(0)])]) is None  # one rollout: "the same way" says nothing


def test_infrastructure_failures_match_on_their_error():
    def infra(k: int, error: str) -> Rollout:
        return rollout(k).model_copy(update={"outcome": Outcome.INFRA_FAILURE, "error": error})

    same = [infra(0, "evaluator failed: boom"), infra(1, "evaluator failed: boom")]
    assert "infrastructure failure: evaluator failed: boom" in (common_failure([group(same)]) or "")
    assert common_failure([group([infra(0, "launch failed: x"), infra(1, "evaluator failed: y")])]) is None
    assert failure_signature(infra(0, "e"), [SimpleNamespace(attempt=0)]) is None
