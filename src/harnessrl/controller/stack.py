"""Everything for rollouts in one process tree: store, engine, gateway, sandbox bridge, controller.

``harnessrl rollout`` uses it to run one rollout end to end; the trainer uses the same pieces. The
gateway runs in a background thread with its own event loop (a real uvicorn server on 127.0.0.1);
the controller runs on the caller's loop; both share the store object, which is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import secrets
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from pydantic import Field, field_validator

from harnessrl.config import EngineConfig, GatewayConfig, Section, StoreConfig
from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import (
    CommandEvaluatorConfig,
    Evaluator,
    EvaluatorConfig,
    ExactMatchEvaluatorConfig,
    build_evaluator,
    parse_evaluator_config,
)
from harnessrl.controller.evaluators.command import EvaluatorSandbox
from harnessrl.controller.harness import check_harness, check_task
from harnessrl.controller.kubernetes.config import KubernetesRunnerConfig
from harnessrl.controller.kubernetes.resources import check_requests_within_limits
from harnessrl.controller.local import LocalRunner
from harnessrl.controller.presets import apply_preset
from harnessrl.engines.base import Engine
from harnessrl.environments.resolve import Environments, HarnessNeeds
from harnessrl.environments.stopping import in_thread_stoppably
from harnessrl.errors import ConfigError, HarnessRLError
from harnessrl.gateway.inputs import check_parsers
from harnessrl.retrieval.config import RetrievalConfig
from harnessrl.sandbox.bwrap import (
    DEFAULT_PATH,
    SYSTEM_DIRS,
    check_mounts,
    python_install_paths,
    require_sandbox,
)
from harnessrl.sandbox.host import files_in_argv
from harnessrl.sandbox.proxy import GatewayBridge
from harnessrl.sandbox.workspace import make_private_dir
from harnessrl.schemas import Rollout, RolloutStatus
from harnessrl.store.base import Store

if TYPE_CHECKING:
    from harnessrl.gateway.control.gating import GatewayHandle


class RolloutConfig(Section):
    """The TOML file of ``harnessrl rollout`` and ``harnessrl controller``."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: GatewayConfig = Field(default_factory=lambda: GatewayConfig(port=0))
    store: StoreConfig | None = None
    harness: HarnessSpec
    evaluator: EvaluatorConfig = Field(default_factory=ExactMatchEvaluatorConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    task: dict[str, Any] | None = None
    kubernetes: KubernetesRunnerConfig | None = Field(
        default=None, description="launch harnesses as Kubernetes Jobs (harnessrl controller only)"
    )
    retrieval: RetrievalConfig | None = Field(
        default=None,
        description="a corpus the gateway serves to the harness's search tool (docs/retrieval.md)",
    )

    @field_validator("evaluator", mode="before")
    @classmethod
    def _parse_evaluator(cls, value: Any) -> Any:
        # parse_evaluator_config names the field as written (evaluator.command), not by the union's tag
        return parse_evaluator_config(value) if isinstance(value, Mapping) else value


def prepare(config: RolloutConfig, run_dir: Path | None = None) -> tuple[HarnessSpec, Evaluator]:
    """Resolve the harness preset and validate harness, sandbox and evaluator before anything starts.

    With the local runner the sandbox must be able to run here (``harness.sandbox = "bwrap"``) and
    no mount may expose ``run_dir`` or the store; a problem is a ``ConfigError`` naming the field.
    """
    harness = apply_preset(config.harness)
    if "search" in harness.tools and config.retrieval is None:
        raise ConfigError('harness.tools: "search" needs a [retrieval] section naming the corpus')
    if config.kubernetes is not None and importlib.util.find_spec("kubernetes") is None:
        raise ConfigError(
            "kubernetes: the kubernetes client is not installed (pip install 'harnessrl[kubernetes]')"
        )
    if config.kubernetes is not None:
        check_pod_workspace(harness, config.evaluator)
        # The template's requests against harness.limits (two sections): at load, not per launch.
        check_requests_within_limits(
            config.kubernetes.job_template,
            harness.limits,
            container_name=config.kubernetes.container_name,
            ephemeral_storage_limit=config.kubernetes.ephemeral_storage_limit,
        )
    if harness.environment is not None and harness.sandbox != "bwrap" and config.kubernetes is None:
        raise ConfigError(
            'harness.environment: task images are sandbox roots and need harness.sandbox = "bwrap"'
        )
    # The run folder and the store's files: no mount of the harness's or the evaluator's sandbox may
    # expose them (the store holds every task's hidden answers; the scorer's sandbox runs the code
    # the policy wrote, so its mounts were as much a way to them as the harness's).
    forbidden = [run_dir] if run_dir is not None else []
    if config.store is not None:
        forbidden += store_files(config.store.url)
    elif run_dir is not None:
        forbidden += store_files(str(run_dir / "harnessrl.db"))
    if config.kubernetes is None:  # with Kubernetes the harness binary lives in the image, not here
        if harness.environment is None or harness.environment.harness == "host":
            check_harness(harness)  # else the image brings it: checked per image (check_environments)
        if harness.environment is None and harness.sandbox == "bwrap":
            check_command_in_sandbox(harness)
        require_sandbox(harness.sandbox)
        check_mounts(harness.mounts, forbidden=forbidden)
        check_mounts_exist(config.harness.mounts, "harness.mounts")  # the user's (a preset's may be optional)
    evaluator_config = config.evaluator
    if isinstance(evaluator_config, CommandEvaluatorConfig):
        check_mounts(evaluator_config.mounts, forbidden=forbidden, field="evaluator.mounts")
        check_mounts_exist(evaluator_config.mounts, "evaluator.mounts")
        check_scorer_command(evaluator_config, in_image=harness.environment is not None)
    # Command evaluators run code the policy wrote: a sandbox of their own, like the harness's.
    evaluator = build_evaluator(
        evaluator_config, validate=True, sandbox=EvaluatorSandbox(mode=harness.sandbox)
    )
    return harness, evaluator


def check_command_in_sandbox(harness: HarnessSpec) -> None:
    """A bare ``harness.command[0]`` (no ``/``) is looked up on the harness's ``PATH`` inside the
    bubblewrap sandbox, which shows only the system folders, harnessrl's Python install and
    ``harness.mounts`` of this machine: a program found here only in another folder (``~/.local/bin``,
    ``/opt/x/bin``, a tool folder in ``/tmp``) passed ``check_harness`` and then failed every attempt
    as an infrastructure failure ("cannot start: not found"). Refused naming the field."""
    exe = harness.command[0]
    if "/" in exe or "{" in exe or shutil.which(exe) is None:
        return  # a path is bound as it is (files_in_argv); not found at all: check_harness says so
    search = harness.env.get("PATH", os.environ.get("PATH", ""))
    if "{" in search:
        return  # a per-rollout template: checked per launch
    shown = [*(Path(d) for d in SYSTEM_DIRS), *python_install_paths(), *(Path(m) for m in harness.mounts)]
    for folder in [str(Path(sys.prefix) / "bin"), *search.split(os.pathsep)]:
        candidate = Path(folder or ".") / exe
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        if _shown(candidate, shown) and _shown(Path(os.path.realpath(candidate)), shown):
            return
    found = shutil.which(exe)
    raise ConfigError(
        f"harness.command[0]: {exe!r} is found at {found!r} here, in a folder the sandbox does not show the harness "
        "(it sees the system folders, harnessrl's Python install and harness.mounts): add its folder "
        "to harness.mounts, or install it under /usr"
    )


def check_mounts_exist(mounts: list[str], field: str) -> None:
    """Each of ``mounts`` is there: the sandbox skips a path that is not, so a typo gave the harness
    (or the scorer) no file and no word, and every rollout failed, or was scored 0, for it."""
    for i, mount in enumerate(mounts):
        if not os.path.exists(mount):
            raise ConfigError(f"{field}[{i}]: {mount!r} does not exist (nothing would be mounted there)")


# The interpreters whose first argument is the script they run (as ``check_harness`` knows them).
_INTERPRETER_NAMES = ("python", "node", "bash", "sh", "zsh", "ruby", "perl", "deno", "bun")


def check_scorer_command(config: CommandEvaluatorConfig, *, in_image: bool) -> None:
    """What a command evaluator runs, before any rollout: the script an interpreter runs
    (``["python3", "/abs/check.py"]``) exists, and a bare program name is on the scorer's ``PATH``
    (harnessrl's venv, then the system folders: not this process's ``PATH``). A missing script
    scored every rollout 0 (the interpreter's exit 2 read as the policy's failure), and a program
    found here only in another folder failed every attempt ("the scorer did not start")."""
    if in_image:
        return  # it runs over the task's image: its script and programs are the image's, not here
    command = config.command
    exe = command[0]
    if len(command) > 1 and Path(exe).name.rstrip("0123456789.") in _INTERPRETER_NAMES:
        script = command[1]
        if os.path.isabs(script) and "{" not in script and not Path(script).is_file():
            raise ConfigError(f"evaluator.command[1]: script {script!r} does not exist")
    if "/" in exe or "{" in exe or "PATH" in config.env:
        return  # a path, a template, a PATH of its own: not the default PATH
    scorer_path = os.pathsep.join([str(Path(sys.prefix) / "bin"), DEFAULT_PATH])
    found = shutil.which(exe)
    if found is not None and shutil.which(exe, path=scorer_path) is None:
        raise ConfigError(
            f"evaluator.command[0]: {exe!r} is found at {found!r} here, but not on the scorer's PATH "
            f"({scorer_path}): install it there, or give its absolute path"
        )


def _shown(path: Path, shown: list[Path]) -> bool:
    return path.is_absolute() and any(path == folder or path.is_relative_to(folder) for folder in shown)


def check_store(url: str) -> None:
    """``store.url`` names a store the run can open: a server store (PostgreSQL) is opened and
    closed now (it must answer), a SQLite file's folder must be writable where it is and a file
    already there must be a SQLite database (another file named by mistake was found only after the
    run folder existed); any problem is a ``ConfigError`` naming ``store.url``. A SQLite file is not
    created here."""
    from harnessrl.config import check_output_path
    from harnessrl.store import open_store, sqlite_path
    from harnessrl.store.sqlite import _may_be_a_database

    try:
        path = sqlite_path(url)
    except ConfigError as exc:
        raise ConfigError(f"store.url: {exc}") from exc
    if path is None:  # a server: it must answer now
        try:
            open_store(url).close()
        except HarnessRLError as exc:
            raise ConfigError(f"store.url: {exc}") from exc
    elif path != ":memory:":
        check_output_path(path, "store.url")
        if Path(path).is_file() and not _may_be_a_database(Path(path)):
            raise ConfigError(
                f"store.url: {path!r} is not a SQLite database (it does not start with SQLite's "
                "header): name the store's file, e.g. runs/x/harnessrl.db"
            )


def store_files(store_url: str) -> list[Path]:
    """The files of the SQLite store ``store_url`` names (the database and the ``-wal``, ``-shm`` and
    ``-journal`` files beside it), which no mount may expose: the store holds every rollout's task,
    ``hidden`` answers included. None for a server URL or ``:memory:``."""
    from harnessrl.store import sqlite_path

    name = sqlite_path(store_url)
    if name is None or name == ":memory:":
        return []
    db = Path(name)
    return [db, *(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]


def check_local_launch(config: Any, store_url: str | None, port_field: str, port: int | None = None) -> None:
    """What the local runner's sandbox needs of a config with ``harness``, ``gateway`` and
    ``evaluator`` sections (a rollout's or a training run's),
    checked before anything starts (each used to be found per launch: every attempt an
    infrastructure failure, or nothing at all):

    - the gateway's port (``port``, else ``gateway.port``; named as ``port_field``) is 0 or >= 1024:
      the sandbox's relay runs as an unprivileged user, which cannot listen below 1024;
    - no ``harness.mounts`` or command ``evaluator.mounts`` entry exposes the SQLite store
      ``store_url`` (``store_files``), which may be another than the config's (the controller's
      ``--store``).

    ``harnessrl rollout`` and ``data calibrate`` always launch locally; the controller and the
    trainer call this only when they launch here (not with ``[kubernetes]`` or external
    controllers: pods use neither the relay nor host mounts)."""
    harness = apply_preset(config.harness)
    port = config.gateway.port if port is None else port
    if harness.sandbox == "bwrap" and harness.network == "gateway" and 0 < port < 1024:
        raise ConfigError(
            f"{port_field}: port {port}: the sandbox relays the gateway to the harness as an unprivileged "
            "user, which cannot listen below 1024; use a port >= 1024"
            + (" (0 picks a free one)" if port_field == "gateway.port" else "")
        )
    if store_url is not None:
        check_mounts(harness.mounts, forbidden=store_files(store_url))
        if isinstance(config.evaluator, CommandEvaluatorConfig):  # the scorer runs the policy's code too
            check_mounts(config.evaluator.mounts, forbidden=store_files(store_url), field="evaluator.mounts")


def check_pod_workspace(harness: HarnessSpec, evaluator: EvaluatorConfig) -> None:
    """With ``[kubernetes]`` the harness works in its pod's workspace (a copy of the image's, plus
    the harness files from its Secret), never in the one the controller prepares on its own machine.
    So a config that needs the controller's workspace in the pod, or the pod's back on the
    controller, is refused naming the field, instead of running the agent on the image's repo
    (its full git history included) and scoring the untouched local folder (docs/kubernetes.md)."""
    if harness.repo is not None:
        raise ConfigError(
            "harness.repo: with [kubernetes] the repo the controller copies (and its git_history "
            f"= {harness.git_history!r}) never reaches the pod, which starts from the image's workspace; "
            "bake the repo into the image (its history stripped) and drop harness.repo"
        )
    if isinstance(evaluator, CommandEvaluatorConfig):
        raise ConfigError(
            'evaluator.type = "command": with [kubernetes] the scorer would run over the controller\'s '
            "local workspace, not the pod's (gone with the pod): use an evaluator that scores the "
            'calls or the log ("exact_match", "reasoning_gym", or a "python" one that ignores the '
            "workspace)"
        )


def check_environments(
    harness: HarnessSpec,
    tasks: Iterable[dict[str, Any]],
    *,
    whole: Iterable[dict[str, Any]] | None = None,
) -> dict[str, int] | None:
    """The tasks' environments, before anything runs (``docs/environments.md``): every image a task
    names is found or built, mounted and checked to run ``harness`` (a preset already applied); a
    problem is a ``ConfigError`` naming the task, the image and what is missing, and so is a set in
    which no task has the environment field while the default is the host (a wrong ``field``: every
    task would run on the host; looked for in ``whole`` where given, the set ``tasks`` are part of).
    Returns how many tasks use each environment; None when the harness has no ``environment`` settings."""
    if harness.environment is None:
        return None
    command = harness.command[:1] if harness.command and "{" not in harness.command[0] else []
    mounts = (
        *(Path(m) for m in harness.mounts),
        *files_in_argv(harness.command, inside=Path("/nonexistent")),
    )
    environments = Environments(harness.environment)
    try:
        return environments.check_tasks(tasks, HarnessNeeds(tuple(command), mounts), whole=whole)
    finally:
        environments.close()  # its mounts given back: the controller mounts what it runs on


@dataclass
class LocalStack:
    store: Store
    gateway_url: str
    admin_key: str
    controller: Controller
    engine: Engine
    gateway: GatewayHandle  # the gateway's gate and engine, for a trainer in this process

    def create_rollout(self, task: dict[str, Any], **fields: Any) -> Rollout:
        return self.store.create_rollout(task=task, **fields)


@contextlib.asynccontextmanager
async def local_stack(
    config: RolloutConfig, run_dir: Path, *, store: Store | None = None, run_id: str | None = None
) -> AsyncIterator[LocalStack]:
    """Start engine + gateway (thread) + bridge + local runner + controller; stop them all on exit."""
    from harnessrl.dashboard import gateway_dashboard
    from harnessrl.engines.factory import create_engine
    from harnessrl.gateway.app import create_app
    from harnessrl.gateway.control.gating import GatewayHandle
    from harnessrl.gateway.process import bind_socket
    from harnessrl.gateway.server import build_teacher, serve_in_thread
    from harnessrl.store import open_store

    harness, evaluator = prepare(config, run_dir)
    check_parsers(config.gateway)
    # Teacher mode (engine.teacher): its key is read from this process's environment, which no
    # harness inherits; an unreachable upstream fails here, before a model loads. The engine (a
    # missing script, model or server names itself) and the retriever come before the run folder
    # and the store too: a config that cannot start leaves nothing half-created.
    teacher = await asyncio.to_thread(build_teacher, config.engine)
    engine = create_engine(config.engine)
    routes: list[Any] = [gateway_dashboard]  # /ui
    if config.retrieval is not None:  # the retriever, on the gateway: the sandbox's one way out
        routes += await asyncio.to_thread(retrieval_routes, config.retrieval)
    if store is None and config.store is not None:  # named as store.url, before the run folder exists
        await asyncio.to_thread(check_store, config.store.url)
    gateway_cfg = config.gateway
    # The port too: a busy one is refused before the run folder and its store exist.
    sock = bind_socket(gateway_cfg.host, gateway_cfg.port)
    own_store = store is None
    made = _first_missing(run_dir)
    try:
        make_private_dir(run_dir)
        if store is None:
            url = config.store.url if config.store else str(run_dir / "harnessrl.db")
            store = open_store(url)
    except BaseException:
        sock.close()
        if made is not None:  # a store that would not open: no run folder left behind for it
            shutil.rmtree(made, ignore_errors=True)
        raise
    if not gateway_cfg.admin_key:
        gateway_cfg = gateway_cfg.model_copy(update={"admin_key": f"hrl-admin-{secrets.token_urlsafe(24)}"})
    try:
        app = create_app(gateway_cfg, store, engine, extra_routes=routes, teacher=teacher)
        with serve_in_thread(app, timeout_s=300, sock=sock) as url:
            port = urlparse(url).port
            assert port is not None
            async with GatewayBridge("127.0.0.1", port) as bridge:
                controller = Controller(
                    store,
                    LocalRunner(bridge_path=bridge.path),
                    gateway=GatewayEndpoint("127.0.0.1", port),
                    harness=harness,
                    evaluator=evaluator,
                    run_dir=run_dir,
                    config=config.controller,
                    run_id=run_id,
                    bridge=bridge,
                )
                try:
                    handle = GatewayHandle(app.state.gateway, url)
                    yield LocalStack(store, url, gateway_cfg.admin_key or "", controller, engine, handle)
                finally:
                    await controller.shutdown()
    finally:
        sock.close()  # serve_in_thread closes it too; this is for a failure before it started
        if own_store:
            store.close()


def _first_missing(path: Path) -> Path | None:
    """The topmost folder of ``path`` (itself included) that does not exist yet: what creating it makes."""
    return next((p for p in (*reversed(path.absolute().parents), path.absolute()) if not p.exists()), None)


def retrieval_routes(config: RetrievalConfig) -> list[Any]:
    """The retriever's gateway routes over ``config.corpus``'s index (built into the cache once per
    corpus content, else opened from it)."""
    from harnessrl.retrieval.index import RetrievalIndex
    from harnessrl.retrieval.route import RetrievalRoutes

    cache = Path(config.cache_dir) if config.cache_dir else None
    return RetrievalRoutes(RetrievalIndex.for_corpus(Path(config.corpus), cache), config).factories()


async def run_one_rollout(
    config: RolloutConfig, task: dict[str, Any], run_dir: Path, *, timeout_s: float | None = None
) -> dict[str, Any]:
    """Run one rollout end to end and return its summary (what ``harnessrl rollout`` prints)."""
    started = time.monotonic()
    harness = apply_preset(config.harness)
    try:  # a task the harness cannot start on fails every attempt: exit 2 before anything is made
        check_task(harness, task)
    except ConfigError as exc:
        raise ConfigError(f"the task does not fit [harness]: {exc}") from None
    if config.harness.environment is not None:  # the task's image: built and checked before anything starts
        await in_thread_stoppably(check_environments, harness, [task])
    rollout_id = f"rollout-{uuid.uuid4().hex[:12]}"
    # A run of its own: the controller claims only this rollout, never another run's queued ones in
    # a store the run folder (or a shared [store] url) already holds.
    async with local_stack(config, run_dir, run_id=rollout_id) as stack:
        rollout = stack.create_rollout(task, rollout_id=rollout_id, run_id=rollout_id)
        limit = timeout_s or rollout_time_limit(config)
        try:
            [done] = await stack.controller.run_until_done([rollout.rollout_id], timeout_s=limit)
        except TimeoutError as exc:
            raise RolloutTimeout(
                f"rollout {rollout.rollout_id} did not end within {limit:g} s (the harness's, the "
                "evaluator's and the audit's time limits for every attempt, plus two minutes)"
            ) from exc
        # The final attempt's calls (the reward's) only: a damaged row of an earlier attempt (retried:
        # the controller could not read it) made reading them all raise, a traceback once it was scored.
        try:
            calls = await asyncio.to_thread(stack.store.list_calls, done.rollout_id, attempt=done.attempt)
            counted: tuple[int | None, int | None] = (
                len(calls),
                sum(len(c.prompt_token_ids) + len(c.response_token_ids) for c in calls),
            )
        except Exception:  # noqa: BLE001 - this attempt's own rows damaged: its error says so
            counted = (None, None)
    attempt_dir = run_dir / "rollouts" / done.rollout_id / f"attempt-{done.attempt}"
    return {
        "rollout_id": done.rollout_id,
        "status": done.status.value,
        "outcome": done.outcome.value if done.outcome else None,
        "reward": done.reward,
        "calls": counted[0],  # None: the store cannot give them back
        "tokens": counted[1],
        "flags": done.flags,
        "attempts": done.attempt + 1,
        "error": done.error if done.status is not RolloutStatus.FINISHED else None,
        "log": str(attempt_dir),
        "store": str(run_dir / "harnessrl.db") if config.store is None else config.store.url,
        "seconds": round(time.monotonic() - started, 2),
    }


class RolloutTimeout(HarnessRLError):
    """``harnessrl rollout``'s rollout did not end within its time limit."""


def rollout_time_limit(config: RolloutConfig) -> float:
    """How long ``harnessrl rollout`` waits for its rollout: every attempt's harness, evaluator and
    audit time limits, plus two minutes for the stack (an evaluator slower than the harness used to
    end the command with a traceback while its rollout was still being scored)."""
    # exact_match has no time limit of its own: it compares two strings in the controller.
    evaluator_s = (
        0.0 if isinstance(config.evaluator, ExactMatchEvaluatorConfig) else config.evaluator.timeout_s
    )
    attempt_s = config.harness.timeout_s + evaluator_s + config.controller.audit.max_seconds
    return attempt_s * (config.controller.max_infra_retries + 1) + 120
