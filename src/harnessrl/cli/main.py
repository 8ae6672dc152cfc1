"""The ``harnessrl`` command.

Each command reads its config (TOML file, ``HARNESSRL_*`` env vars, ``--set section.key=value``
overrides), validates it into typed models, and only then imports the component it starts.
Config errors print one line naming the bad field and exit with status 2.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from harnessrl import __version__
from harnessrl.errors import HarnessRLError

app = typer.Typer(
    name="harnessrl",
    help="Reinforcement learning for LLM agents inside their real, unmodified harnesses.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print an error for a person and return the Exit to raise."""
    typer.secho(f"harnessrl: error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


@app.command()
def version() -> None:
    """Print the harnessrl version."""
    typer.echo(__version__)


@app.command()
def gateway(
    model: Annotated[
        str, typer.Option(help="tiny | smollm2 | scripted:FILE | a model folder | a .gguf file")
    ] = "tiny",
    port: Annotated[int, typer.Option(help="TCP port on --host (0 picks a free one)")] = 8000,
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
    store: Annotated[str, typer.Option(help="Store file (SQLite) or URL")] = "runs/gateway/harnessrl.db",
    config: Annotated[str | None, typer.Option(help="TOML file with [gateway] and [engine] sections")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: section.key=value")
    ] = None,
) -> None:
    """Serve a policy behind the OpenAI-compatible gateway, recording every call token-exactly.

    The admin key comes from HARNESSRL_ADMIN_KEY; if unset, one is generated and printed.
    """
    from harnessrl.config import EngineConfig, GatewayConfig, load_raw_config, validate_config

    try:
        raw = load_raw_config(config, set_)
        gateway_raw = {"host": host, "port": port, **raw.get("gateway", {})}
        if os.environ.get("HARNESSRL_ADMIN_KEY"):
            gateway_raw["admin_key"] = os.environ["HARNESSRL_ADMIN_KEY"]
        engine_raw = {"model": model, **raw.get("engine", {})}
        unknown = set(raw) - {"gateway", "engine", "store"}
        if unknown:
            raise fail(f"unknown config section(s): {', '.join(sorted(unknown))}")
        gateway_cfg = validate_config(GatewayConfig, gateway_raw, where="gateway")
        engine_cfg = validate_config(EngineConfig, engine_raw, where="engine")
        store_url = raw.get("store", {}).get("url", store)
    except HarnessRLError as exc:
        raise fail(str(exc)) from exc

    from harnessrl.gateway.server import run_gateway

    try:
        run_gateway(gateway_cfg, engine_cfg, store_url)
    except HarnessRLError as exc:
        raise fail(str(exc), code=1) from exc


def main() -> None:  # pragma: no cover - thin wrapper for `python -m harnessrl`
    sys.exit(app())
