"""``harnessrl rollout`` (one rollout end to end) and ``harnessrl controller`` (a long-running
controller against a separately started gateway and a shared store)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from harnessrl.config import check_output_path, load_raw_config, resolve_relative_paths, validate_config
from harnessrl.errors import ConfigError
from harnessrl.stop_signals import Signalled, until_signalled

# Sections only `harnessrl train` reads: a controller started for a training run takes the run's own
# config file and ignores them.
TRAIN_ONLY_SECTIONS = ("run", "tasks", "heldout", "algorithm", "optimizer", "trainer", "metrics")
T = TypeVar("T")


def load_rollout_config(path: str | None, overrides: list[str] | None, *, ignore: tuple[str, ...] = ()):
    from harnessrl.controller.stack import RolloutConfig

    raw = load_raw_config(path, overrides)
    raw = {k: v for k, v in raw.items() if k not in ignore}
    if path is not None:
        raw = resolve_relative_paths(raw, Path(path).resolve().parent)
    return validate_config(RolloutConfig, raw)


def parse_task(text: str | None, default: dict[str, Any] | None) -> dict[str, Any]:
    """The task of ``--task`` (JSON, or ``@file.json``) or else the config's ``[task]`` table; one that
    shows the harness an evaluator-only field (``answer`` at top level) is refused."""
    from harnessrl.tasks.fields import check_visible

    if text is None:
        if default is None:
            raise ConfigError("no task: pass --task @file.json (or JSON) or put a [task] table in the config")
        check_visible(default, where="[task]")
        return default
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise ConfigError(f"--task {text!r}: {str(path)!r} is not a file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--task {text!r}: not UTF-8 text: {exc}") from exc
    try:
        task = json.loads(text)
    except ValueError as exc:  # a JSONDecodeError, or an integer past Python's 4,300-digit limit
        raise ConfigError(f"--task is not valid JSON: {exc}") from exc
    except RecursionError:  # [[[[...: json's decoder recurses once per level
        raise ConfigError("--task is nested too deeply to read") from None
    if not isinstance(task, dict):
        raise ConfigError("--task must be a JSON object")
    check_visible(task, where="--task")
    return task


def run_rollout_command(
    config_path: str, task_text: str | None, run_dir: str | None, overrides: list[str]
) -> dict:
    from harnessrl.controller.stack import check_local_launch, prepare, run_one_rollout

    if run_dir == "":  # `--run-dir "$UNSET"`: a temp folder was used without a word
        raise ConfigError("--run-dir is empty: give the folder (or leave --run-dir out for a temp folder)")
    config = load_rollout_config(config_path, overrides)
    task = parse_task(task_text, config.task)
    try:  # a field the evaluator needs missing (hidden.answer): exit 2, not 3 infrastructure failures
        config.evaluator.check_task(task)
    except ConfigError as exc:
        # A problem of the config itself (a missing harness executable, a visible evaluator.field)
        # is named first, as it is for a task that fits: prepare() raises it.
        prepare(config, Path(run_dir) if run_dir else None)
        raise ConfigError(f"the evaluator cannot score the task: {exc}") from None
    check_local_launch(config, config.store.url if config.store is not None else None, "gateway.port")
    if run_dir:  # a file there (or above it) is named now, not a traceback once the stack started
        check_output_path(run_dir, "--run-dir", kind="folder")
    folder = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="harnessrl-rollout-"))
    try:
        return run_stoppable(run_one_rollout(config, task, folder))
    except Terminated:
        # Stopped like Ctrl-C: the attempt killed, the rollout requeued, the stack closed. 143 is the
        # shell's status for a process ended by SIGTERM.
        print("harnessrl rollout: stopped by SIGTERM (the rollout was requeued)", file=sys.stderr)
        raise SystemExit(128 + signal.SIGTERM) from None
    except BaseException:
        if run_dir is None and not any(folder.iterdir()):
            folder.rmdir()  # a temp folder of ours that nothing was written to: nothing half-created
        raise


def check_shared_store(store_url: str) -> None:
    """``--store`` of ``harnessrl controller`` is the gateway's store, which exists already: a SQLite
    path that is not a file is a typo (it used to become a new, empty store polled forever, or a
    traceback for a folder). A server URL is checked when it is opened."""
    from harnessrl.store import sqlite_path

    name = sqlite_path(store_url)
    if name is None:
        return
    path = Path(name)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no file"
        raise ConfigError(f"--store {store_url!r}: {what} there; name the gateway's store (its --store)")


class Terminated(Exception):
    """The command was stopped by SIGTERM (and cleaned up as for Ctrl-C)."""


def run_stoppable(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)`` where SIGTERM and Ctrl-C cancel ``work`` through the event loop
    (``stop_signals``): the same cleanup for both (the attempt killed, the rollout requeued, gateway
    and engine closed), then ``Terminated`` or ``KeyboardInterrupt``. A second signal gets the
    default action: a cleanup that hangs can still be ended."""
    try:
        return asyncio.run(until_signalled(work))
    except Signalled as exc:
        if exc.signum == signal.SIGTERM:
            raise Terminated from None
        raise KeyboardInterrupt from None


def run_controller_command(
    config_path: str, store_url: str, gateway_url: str, run_dir: str, overrides: list[str]
) -> None:
    from urllib.parse import urlparse

    from harnessrl.controller.controller import Controller, GatewayEndpoint
    from harnessrl.controller.local import LocalRunner
    from harnessrl.controller.stack import check_local_launch, prepare
    from harnessrl.environments.stopping import kill_builds_until_threads_end
    from harnessrl.sandbox.proxy import GatewayBridge
    from harnessrl.store import open_store

    if not run_dir:  # Path("") is the working directory: every workspace made there, unasked
        raise ConfigError("--run-dir is empty: give the folder for workspaces and logs")
    config = load_rollout_config(config_path, overrides, ignore=TRAIN_ONLY_SECTIONS)
    check_output_path(run_dir, "--run-dir", kind="folder")  # before the store is opened (created)
    harness, evaluator = prepare(config, Path(run_dir))
    if config.kubernetes is not None:
        # Pods reach the gateway at kubernetes.gateway_url; the runner rewrites the harness's URLs.
        gateway_url = gateway_url or config.kubernetes.gateway_url
    parsed = urlparse(gateway_url)
    try:
        port = parsed.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        port = None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port:
        raise ConfigError(f"--gateway-url {gateway_url!r} must look like http://127.0.0.1:8000")
    check_shared_store(store_url)
    if config.kubernetes is None:
        check_local_launch(config, store_url, "--gateway-url", port)

    async def main() -> None:
        store = open_store(store_url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        handled = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
        builds_killed: list[asyncio.Task[None]] = []

        def on_signal() -> None:
            stop.set()
            for sig in handled:  # a second signal gets the default action: a hung stop can be ended
                loop.remove_signal_handler(sig)
            # A rollout's image built on demand: its thread would keep the stop waiting for the build.
            builds_killed.append(loop.create_task(_kill_builds_while_stopping()))

        for sig in handled:
            loop.add_signal_handler(sig, on_signal)
        try:
            async with GatewayBridge(parsed.hostname, port) as bridge:
                if config.kubernetes is not None:
                    from harnessrl.controller.kubernetes import KubernetesRunner

                    runner = KubernetesRunner(config=config.kubernetes)
                else:
                    runner = LocalRunner(bridge_path=bridge.path)
                controller = Controller(
                    store,
                    runner,
                    gateway=GatewayEndpoint("127.0.0.1", port),
                    harness=harness,
                    evaluator=evaluator,
                    run_dir=Path(run_dir),
                    config=config.controller,
                    bridge=bridge if config.kubernetes is None else None,  # pods do not use it
                )
                print(
                    f"harnessrl controller {controller.worker_id}: taking queued rollouts from {store_url}",
                    flush=True,
                )
                await controller.run_forever(stop)
        finally:
            try:
                if stop.is_set():
                    await kill_builds_until_threads_end()
            finally:
                for task in builds_killed:
                    task.cancel()
                store.close()

    asyncio.run(main())


async def _kill_builds_while_stopping() -> None:
    from harnessrl.environments.stopping import KILL_AGAIN_S, kill_own_builds

    while True:
        kill_own_builds()
        await asyncio.sleep(KILL_AGAIN_S)
