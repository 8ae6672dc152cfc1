"""Every policy the trainer can hold implements ``trainer.base.Policy`` in full, with the protocol's
signatures: ``TrainablePolicy`` (one process), ``ShardedPolicy`` (a torchrun rank) and
``LeaderPolicy`` (rank 0's handle). ``TrainingLoop.policy`` was once ``Any``, which hid that the two
torchrun policies had no ``response_logprobs``: torchrun with remote servers failed at the
served-weights check (``tests/vllm/test_train.py::test_torchrun_trains_against_the_server_after_the_served_weights_check``
runs that path end to end)."""

from __future__ import annotations

import inspect

import pytest

from harnessrl.trainer.base import Policy, Weights
from harnessrl.trainer.distributed import ShardedPolicy
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trainer.torchrun import LeaderPolicy


def protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    methods = {}
    for cls in reversed(protocol.__mro__):
        if cls in (Policy, Weights):
            for name, value in vars(cls).items():
                if callable(value) and not name.startswith("_"):
                    methods[name] = inspect.signature(value)
    return methods


def shape_of(parameters: list[inspect.Parameter]) -> list[tuple[str, object, object]]:
    """Parameter names, kinds and defaults (annotations are strings under postponed evaluation)."""
    return [(p.name, p.kind, p.default) for p in parameters]


def shape(signature: inspect.Signature) -> list[tuple[str, object, object]]:
    return shape_of(list(signature.parameters.values()))


def test_the_protocol_has_what_the_run_the_loop_and_the_fleets_call():
    assert set(protocol_methods(Policy)) == {
        "train_step",
        "response_logprobs",
        "engine_state_dict",
        "save_checkpoint",
        "save_adapter",  # LoRA: what remote engines load each step instead of the whole model
        "load_trainer_state",
    }


@pytest.mark.parametrize("implementation", [TrainablePolicy, ShardedPolicy, LeaderPolicy])
def test_each_policy_implements_every_method_with_the_protocols_signature(implementation: type):
    for name, wanted in protocol_methods(Policy).items():
        method = getattr(implementation, name, None)
        assert method is not None, f"{implementation.__name__} has no {name}"
        got = list(inspect.signature(method).parameters.values())
        # The protocol's parameters, as declared; more only as keyword-only ones with a default.
        assert shape_of(got[: len(wanted.parameters)]) == shape(wanted), (implementation.__name__, name)
        extra = got[len(wanted.parameters) :]
        assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra), (
            implementation.__name__,
            name,
        )
