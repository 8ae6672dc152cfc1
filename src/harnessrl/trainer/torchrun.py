"""``torchrun --nproc_per_node N -m harnessrl.trainer.torchrun CONFIG``: a ``harnessrl train`` run
whose policy is sharded over N ranks (FSDP2, ``harnessrl.trainer.distributed``).

Rank 0 runs the whole stack exactly as one process does (store, engine, gateway, controller, the
``Trainer`` loop); its policy is a ``LeaderPolicy``, which broadcasts every call (the step with its
samples, the weight gather for the engine, checkpoints, loading optimizer state) over a command
channel before running it, so all ranks enter the same collectives in the same order. The other
ranks only train: ``follow`` builds the same sharded policy when rank 0 does and runs rank 0's
commands until it says stop. A signal stops rank 0's run as it stops ``harnessrl train`` (``lead``):
torchrun sends one to every rank when it is stopped and when any rank fails. A follower stopped by
Ctrl-C, or left alone by the others (rank 0 stopped or died, another follower died in a collective),
says so in one line (``follow_until_stopped``) instead of a KeyboardInterrupt or gloo traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.errors import ConfigError, HarnessRLError
from harnessrl.stop_signals import Signalled, until_signalled
from harnessrl.trainer.checkpoint import CheckpointUnreadable
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.distributed import DistributedContext, ShardedPolicy, init_distributed
from harnessrl.trainer.interrupted import RunInterrupted, start_up_terminated
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trainer.train_step import NonFiniteStep
from harnessrl.trajectory import Sample

T = TypeVar("T")


class LeaderPolicy:
    """Rank 0's policy for ``Trainer`` (a ``trainer.base.Policy``): each call is broadcast to the
    other ranks (``follow``), then run here, so all ranks enter the same collectives in the same
    order. Every method of the protocol is here: a missing one is an ``AttributeError`` only rank 0
    would see, with the other ranks waiting for a command that never comes."""

    def __init__(self, sharded: ShardedPolicy):
        self.sharded = sharded

    def _command(self, name: str, *args: Any, **kwargs: Any) -> Any:
        dist.broadcast_object_list([(name, args, kwargs)], src=0, group=self.sharded.ctx.control)
        return getattr(self.sharded, name)(*args, **kwargs)

    def train_step(
        self,
        samples: list[Sample],
        algorithm: AlgorithmConfig,
        *,
        temperature: float,
        micro_batch_tokens: int,
    ) -> dict[str, float]:
        return self._command(
            "train_step", samples, algorithm, temperature=temperature, micro_batch_tokens=micro_batch_tokens
        )

    def response_logprobs(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        return self._command("response_logprobs", prompt_ids, response_ids, temperature)

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        return self._command("engine_state_dict")

    def save_checkpoint(self, folder: Path, *, with_optimizer: bool = True) -> Path:
        return self._command("save_checkpoint", folder, with_optimizer=with_optimizer)

    def save_adapter(self, folder: Path) -> bool:
        return self._command("save_adapter", folder)

    def load_trainer_state(self, folder: Path) -> None:
        self._command("load_trainer_state", folder)


#: Errors a command raises on every rank alike, from values all ranks share: ``NonFiniteStep`` (the
#: step's loss and gradient norm are the whole step's), ``ConfigError`` (from the same config and
#: samples) and ``CheckpointUnreadable`` (rank 0's verdict on a checkpoint file, broadcast). Another
#: error on a follower is its own (out of memory, say): it exits, and torchrun ends the run (rank 0
#: stops cleanly on torchrun's SIGTERM), rather than leave rank 0 waiting in a collective the
#: follower never enters.
RANK_SYMMETRIC_ERRORS = (NonFiniteStep, ConfigError, CheckpointUnreadable)


class RanksLost(HarnessRLError):
    """The other ranks went away under this follower (their connections closed or reset)."""


#: What gloo says when the other end of a rank's connection went away (it raises a bare
#: ``RuntimeError``; nccl raises ``DistBackendError``).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _is_peer_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank went away (not this rank's own
    error, such as running out of memory, whose traceback is worth reading)."""
    if isinstance(exc, dist.DistNetworkError):
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _PEER_GONE)


def _first_line(exc: BaseException) -> str:
    """The gist of a collective's error: gloo's first sentence, without its source location."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = text.splitlines()[0]
    if line.startswith("[") and "] " in line:  # "[.../gloo/transport/tcp/pair.cc:553] Connection closed..."
        line = line.split("] ", 1)[1]
    return line.split(". ", 1)[0]


def _receive(ctx: DistributedContext) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    box: list[Any] = [None]
    try:
        dist.broadcast_object_list(box, src=0, group=ctx.control)
    except RuntimeError as exc:  # rank 0 stopped or died, or a follower the broadcast passes through
        raise RanksLost(
            f"a rank went away while this rank waited for rank 0's next command ({_first_line(exc)}); "
            "the first rank to fail says why (torchrun names it)"
        ) from None
    return box[0]


def follow_until_stopped(ctx: DistributedContext) -> int:
    """``follow``, ended in one line (and an exit status) when it ends by Ctrl-C or by the other ranks
    going away: torchrun stops every rank then, and a traceback per follower buried rank 0's message.
    Any other error of this rank is its own and keeps its traceback."""
    try:
        follow(ctx)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C and torchrun's both come
        print(f"harnessrl: rank {ctx.rank}: stopped by SIGINT (rank 0 stops the run)", file=sys.stderr)
        return 128 + signal.SIGINT
    except RanksLost as exc:
        print(f"harnessrl: rank {ctx.rank}: {exc}", file=sys.stderr)
        return 1
    return 0


def follow(ctx: DistributedContext) -> None:
    """Ranks > 0: build the sharded policy when rank 0 does, then run rank 0's commands until it stops."""
    sharded: ShardedPolicy | None = None
    while True:
        name, args, kwargs = _receive(ctx)
        if name == "stop":
            return
        try:
            sharded = _run_command(ctx, sharded, name, args, kwargs)
        except RANK_SYMMETRIC_ERRORS:
            # Rank 0 raised the same error from the same call, and its run decides what follows (it
            # stops with that error and sends "stop"). A follower dying of it made torchrun kill rank 0
            # before it could report the error or record the run's status.
            continue


def _run_command(
    ctx: DistributedContext,
    sharded: ShardedPolicy | None,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> ShardedPolicy:
    """Run one of rank 0's commands here; returns this rank's sharded policy from then on."""
    if name == "build":
        config, model_dir = args
        return ShardedPolicy(ctx, functools.partial(TrainablePolicy.from_config, config, model_dir, **kwargs))
    if sharded is None:  # rank 0 always builds first (leader_policy_factory): a broken protocol
        raise RuntimeError(f"rank 0 sent {name!r} before 'build'")
    try:
        getattr(sharded, name)(*args, **kwargs)
    except RuntimeError as exc:
        if _is_peer_gone(exc):  # another rank died in the collective: torchrun stops this one next
            raise RanksLost(
                f"a rank went away during {name!r} ({_first_line(exc)}); the first rank to fail says "
                "why (torchrun names it)"
            ) from None
        raise
    return sharded


def leader_policy_factory(
    ctx: DistributedContext, config: TrainConfig
) -> Callable[[Path, Path], LeaderPolicy]:
    """``Trainer(policy_factory=...)`` for rank 0: tells the other ranks which weights to load
    (``model_dir``), which the KL reference is (``reference_dir``: the run's starting weights) and,
    for a LoRA ``--resume``, the adapter to continue (``adapter_dir``)."""

    def make(model_dir: Path, reference_dir: Path, adapter_dir: Path | None = None) -> LeaderPolicy:
        kwargs = {"reference_dir": reference_dir, "adapter_dir": adapter_dir}
        dist.broadcast_object_list([("build", (config, model_dir), kwargs)], src=0, group=ctx.control)
        build = functools.partial(TrainablePolicy.from_config, config, model_dir, **kwargs)
        return LeaderPolicy(ShardedPolicy(ctx, build))

    return make


def main(argv: Sequence[str] | None = None) -> int:
    """``torchrun --nproc_per_node N -m harnessrl.trainer.torchrun CONFIG [--resume RUN] [--set k=v]``."""
    parser = argparse.ArgumentParser(prog="torchrun ... -m harnessrl.trainer.torchrun")
    parser.add_argument("config", nargs="?")
    parser.add_argument("--resume")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    if args.config is not None and args.resume is not None:  # CONFIG would be ignored: its changes lost
        parser.error(  # on every rank alike (exit 2), before any of them joins the others
            "give CONFIG for a new run or --resume RUN_DIR to continue one, not both "
            "(a resumed run keeps its config.json; change a value with --set section.key=value)"
        )
    from harnessrl.trainer import allocator

    # Every rank, as ``harnessrl train`` does before the model's tensors: blocks up to 32 MB from the
    # heap, reused within a micro-batch (each rank's CPU step faults its pages in once), 2 arenas.
    # Only ``cli.train`` called it, so no rank of a torchrun run, rank 0 included, had it.
    allocator.tune()
    try:
        ctx = init_distributed()
    except ConfigError as exc:  # started without torchrun: no world to leave
        print(f"harnessrl: error: {exc}", file=sys.stderr)
        return 2
    try:
        if not ctx.is_leader:
            return follow_until_stopped(ctx)
        summary = lead(ctx, args.config, args.resume, args.overrides)
        print(json.dumps({**summary, "world_size": ctx.world_size}))
        return 0
    except RunInterrupted as exc:
        print(f"harnessrl: {exc}", file=sys.stderr)
        return exc.exit_code
    except HarnessRLError as exc:
        print(f"harnessrl: error: {exc}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()


def lead(
    ctx: DistributedContext, config: str | None, resume: str | None, overrides: list[str]
) -> dict[str, Any]:
    """Rank 0: the run as ``harnessrl train`` runs it (``cli/train.py``), leading the other ranks.

    SIGINT and SIGTERM stop it the same clean way (``until_signalled``): torchrun sends SIGTERM to
    every rank when it is stopped and when one rank fails (a follower out of memory), and rank 0 then
    kills its harnesses, requeues the rollouts in flight and marks the run stopped instead of dying
    with the run left "running". A start-up that fails or is stopped before the first step removes a
    new run's folder, so the same command starts it again. The followers are told to stop, except
    after a signal: torchrun stops them then, and one may be dead (a send to it would fail)."""
    from harnessrl.trainer.run import Trainer
    from harnessrl.trainer.run_setup import open_run

    signalled = False
    try:
        run = open_run(config, resume, overrides)
        trainer = None
        # SIGTERM before the event loop's handlers (building the trainer) stops the start-up too.
        previous_sigterm = signal.signal(signal.SIGTERM, start_up_terminated(run.run_dir, entry="torchrun"))
        with run.folder:  # held for the run's life, as by harnessrl train: a second run is refused
            try:
                trainer = Trainer(
                    run.config,
                    run.run_dir,
                    resume=bool(resume),
                    base_dir=run.base_dir,
                    tasks=run.tasks,
                    heldout=run.heldout,
                    policy_factory=leader_policy_factory(ctx, run.config),
                )
                return asyncio.run(_until_signalled(trainer.run(), run.run_dir))
            except BaseException as exc:
                signalled = isinstance(exc, RunInterrupted)
                if trainer is None or not trainer.started:
                    run.folder.discard()  # a new run's only (a resumed folder is never removed)
                    if isinstance(exc, RunInterrupted) and not resume:
                        raise RunInterrupted(
                            exc.signum, run.run_dir, discarded=True, entry="torchrun"
                        ) from None
                raise
            finally:
                signal.signal(signal.SIGTERM, previous_sigterm)
    finally:
        if not signalled:
            dist.broadcast_object_list([("stop", (), {})], src=0, group=ctx.control)


async def _until_signalled(work: Coroutine[Any, Any, T], run_dir: Path) -> T:
    """Await ``work``; on SIGINT or SIGTERM cancel it (its ``finally`` blocks do the clean shutdown)
    and raise ``RunInterrupted``, as ``harnessrl train`` does. Unlike there, a second signal does not
    cut the shutdown short: a Ctrl-C reaches rank 0 twice (from the terminal, and forwarded by
    torchrun), and torchrun ends a shutdown that hangs itself, with SIGKILL after its
    ``--shutdown-timeout`` (30 s by default)."""
    try:
        return await until_signalled(work, again="ignore")
    except Signalled as exc:
        raise RunInterrupted(exc.signum, run_dir, entry="torchrun") from None


if __name__ == "__main__":
    sys.exit(main())
