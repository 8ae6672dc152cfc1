"""A rollout finished behind its controller's back: its finish's ``calls_seen`` is not believed.

The agent, with a stolen admin key, finishes its own rollout with ``metadata.calls_seen = 0``; the
controller voids it (reward 0, flag ``tamper_finished``) but the metadata stays. Believing it left
every call of the voided rollout out of training, so the tampering got no negative advantage.
"""

from __future__ import annotations

from pathlib import Path

from harnessrl.controller.tamper import TAMPER_FINISHED
from harnessrl.schemas import Call, Outcome
from harnessrl.store import open_store
from harnessrl.trajectory import CALLS_SEEN_KEY, build_batch, build_rollout_samples, calls_seen


def _rollout_with_two_calls(store):
    rollout = store.start_rollout(store.create_rollout(task_id="t", step=0).rollout_id)
    store.add_call(
        Call(
            rollout_id=rollout.rollout_id,
            prompt_token_ids=[1, 2],
            response_token_ids=[3],
            response_logprobs=[-0.1],
        )
    )
    store.add_call(
        Call(
            rollout_id=rollout.rollout_id,
            prompt_token_ids=[1, 2, 3, 4],
            response_token_ids=[5, 6],
            response_logprobs=[-0.2, -0.3],
        )
    )
    return rollout


def test_a_tamper_finished_rollout_trains_on_every_call_whatever_its_calls_seen_says(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    rollout = _rollout_with_two_calls(store)
    # The agent's finish (stolen admin key), then the controller's verdict on it.
    store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0, metadata={CALLS_SEEN_KEY: 0})
    voided = store.void_rollout(rollout.rollout_id, flag=TAMPER_FINISHED, error="finished elsewhere")
    assert voided.reward == 0.0 and voided.metadata[CALLS_SEEN_KEY] == 0  # the claim is still there

    assert calls_seen(voided) is None
    built = build_rollout_samples(voided, store.list_calls(rollout.rollout_id))
    assert built.calls_unseen == 0 and built.calls_used == 2
    [sample] = built.samples
    assert sample.input_ids == [1, 2, 3, 4, 5, 6] and sample.loss_mask == [0, 0, 1, 0, 1, 1]
    batch = build_batch([(voided, store.list_calls(rollout.rollout_id))])
    assert batch.stats.calls_unseen == 0 and batch.stats.loss_tokens == 3


def test_the_controllers_own_calls_seen_is_still_applied(tmp_path: Path) -> None:
    """The control: a rollout its controller finished keeps out the calls its evaluator did not see."""
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    rollout = _rollout_with_two_calls(store)
    finished = store.finish_rollout(rollout.rollout_id, Outcome.SUCCESS, 1.0, metadata={CALLS_SEEN_KEY: 1})
    assert calls_seen(finished) == 1
    built = build_rollout_samples(finished, store.list_calls(rollout.rollout_id))
    assert built.calls_unseen == 1 and built.calls_used == 1
    [sample] = built.samples
    assert sample.input_ids == [1, 2, 3] and sample.loss_mask == [0, 0, 1]
