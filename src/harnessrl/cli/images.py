"""``harnessrl images``: the task environments' images (docs/environments.md): build, list, prune, df.

``build`` reads the ``[harness.environment]`` section of a rollout or training config (any other
section is ignored) and builds or finds every environment it names, printing one JSON line per
image and a summary; the other commands work on the image store (``--store``, default
``$HARNESSRL_CACHE_DIR/containers``) and never create one: a folder without ``storage/`` holds no
images. Every command prints JSON; errors exit with status 2.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from harnessrl.errors import HarnessRLError

app = typer.Typer(
    name="images",
    help="Task environments' container images: build, list, prune, df (docs/environments.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

StoreOption = Annotated[
    Path | None, typer.Option(help="Image store folder (default: $HARNESSRL_CACHE_DIR/containers)")
]


def _fail(exc: HarnessRLError) -> typer.Exit:
    typer.secho(f"harnessrl: error: {exc}", err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def environment_config(path: Path, overrides: list[str], *, keep: bool = False):
    """The ``[harness.environment]`` of a config file, relative paths resolved against its folder.
    ``keep``: the file is ``prune --keep``'s, and one without the section is named as that option's."""
    from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
    from harnessrl.environments.config import EnvironmentConfig
    from harnessrl.errors import ConfigError

    raw = resolve_relative_paths(load_raw_config(str(path), overrides), path.resolve().parent)
    harness = raw.get("harness") or {}
    if not isinstance(harness, dict):
        raise ConfigError(f"{path}: harness: must be a [harness] table, not {type(harness).__name__}")
    section = harness.get("environment")
    if section is None and keep:  # "nothing to build" misled: prune builds nothing
        raise ConfigError(
            f"--keep {str(path)!r}: no [harness.environment] section, so no images to keep: name the "
            "config whose images to keep (or --all to remove every image)"
        )
    if section is None:
        raise ConfigError(f"{path}: no [harness.environment] section: nothing to build")
    return validate_config(EnvironmentConfig, section, where="harness.environment")


def _store(store: Path | None, config: Any = None):
    from harnessrl.environments.store import ImageStore

    if config is not None:
        if store is not None:
            config = config.model_copy(update={"store": str(store)})
        return ImageStore.from_config(config)
    return ImageStore(store)


def _existing(store: Path | None) -> Path | None:
    """``--store`` for the commands that only read or prune a store: one that is not there is named,
    not created (podman would set up a whole new store in it)."""
    from harnessrl.errors import ConfigError

    if store is not None and not store.is_dir():
        raise ConfigError(f"--store {str(store)!r}: no image store there (harnessrl images build makes one)")
    return store


def _usable(store: Path | None) -> Path | None:
    """``--store`` for build, which makes the store: a file in the way is named, not a traceback."""
    from harnessrl.errors import ConfigError

    if store is not None and store.exists() and not store.is_dir():
        raise ConfigError(f"--store {str(store)!r}: not a folder")
    return store


#: How often ``images build`` says on stderr that a build is still going.
PROGRESS_EVERY_S = 30.0


@contextlib.contextmanager
def _progress(name: str, logs: Path, every_s: float = PROGRESS_EVERY_S) -> Iterator[None]:
    """Say on stderr which environment is being built or found and where its log is, then every
    ``every_s`` while it lasts: a build takes minutes, and stdout has its JSON line only at the end."""
    typer.echo(f"harnessrl images: {name}: building or finding (build logs: {logs})", err=True)
    started = time.monotonic()
    done = threading.Event()

    def report() -> None:
        while not done.wait(every_s):
            typer.echo(
                f"harnessrl images: {name}: still building after {time.monotonic() - started:.0f} s",
                err=True,
            )

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()


@app.command("build")
def build_command(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG", help="A rollout or training config")],
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Build only this environment (repeatable)")
    ] = None,
    store: StoreOption = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="section.key=value overrides")] = None,
) -> None:
    """Build (or find) every environment of the config's [harness.environment] images."""
    import signal

    from harnessrl.environments.podman import ImageError, podman_problem

    # SIGTERM stops a build as Ctrl-C does: the command killed with every process it started, its
    # scratch removed (it used to end the process at once, the build and its RUN steps left running).
    signal.signal(signal.SIGTERM, _terminated)
    try:
        config = environment_config(config_path, set_ or [])
        problem = podman_problem()
        if problem is not None:
            raise ImageError(problem)
        images = _store(_usable(store), config)
        names = only or list(config.images)
        unknown = [n for n in names if n not in config.images]
        if unknown:
            raise ImageError(
                f"--only {unknown[0]!r}: not in harness.environment.images ({sorted(config.images)})"
            )
        built = []
        for name in names:
            with _progress(name, images.folder / "logs"):
                image = images.ensure(name, config.images[name], recipes=config.images)
            row = {
                "name": name,
                "reference": image.reference,
                "id": image.image_id[:12],
                "built": image.built,
                "seconds": image.seconds,
            }
            typer.echo(json.dumps(row))
            built.append(row)
    except HarnessRLError as exc:
        raise _fail(exc) from exc
    except Terminated:
        typer.echo("harnessrl images: stopped by SIGTERM (the build was killed)", err=True)
        raise typer.Exit(128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    usage = images.disk_usage()
    typer.echo(
        json.dumps(
            {
                "images": len(built),
                "built_now": sum(r["built"] for r in built),
                "seconds": round(sum(r["seconds"] for r in built), 3),
                "store": usage["store"],
                "store_bytes": usage["store_bytes"],
            }
        )
    )


class Terminated(BaseException):
    """SIGTERM, raised where the main thread is (a BaseException, as KeyboardInterrupt is: no
    ``except Exception`` on the way swallows it)."""


def _terminated(*_: object) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM during the clean-up acts at once
    raise Terminated


@app.command("list")
def list_command(store: StoreOption = None) -> None:
    """harnessrl's images in the store: name, references, id, recipe digest, size (one JSON line each)."""
    try:
        for row in _store(_existing(store)).list():
            typer.echo(json.dumps({**row, "id": row["id"][:12]}))
    except HarnessRLError as exc:
        raise _fail(exc) from exc


@app.command("df")
def df_command(store: StoreOption = None) -> None:
    """Disk use: the whole store (shared layers once) and each image."""
    try:
        typer.echo(json.dumps(_store(_existing(store)).disk_usage()))
    except HarnessRLError as exc:
        raise _fail(exc) from exc


@app.command("prune")
def prune_command(
    store: StoreOption = None,
    keep: Annotated[
        Path | None,
        typer.Option(help="Keep the current images of this config's environments; remove the rest"),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every harnessrl image")] = False,
) -> None:
    """Remove images: by default those superseded by another recipe of the same environment (no longer
    tagged :latest); --keep CONFIG keeps only that config's current images (building nothing); both
    keep images a run has mounted; --all removes them all."""
    from harnessrl.environments.store import PREFIX, ImageStore
    from harnessrl.errors import ConfigError

    try:
        if keep is not None and all_:
            raise ConfigError("--keep and --all: give one of them, not both")
        _existing(store)
        images: ImageStore
        if keep is not None:
            config = environment_config(keep, [], keep=True)
            images = _store(store, config)
            kept: set[str] = set()
            if images.exists:  # a config's images are looked up, never built, to be kept
                for name, recipe in config.images.items():
                    # An ``image`` reference too: it may name one of harnessrl's own builds
                    # (``localhost/harnessrl/x:DIGEST``), which prune would otherwise remove. And
                    # the images a recipe reads (its base built by another config): kept with it.
                    kept |= images.needed_ids(name, recipe, config.images)
            report = images.prune(kept)
        elif all_:
            images = _store(store)
            report = images.prune(None)
        else:
            images = _store(store)
            current = {
                row["id"]
                for row in images.list()
                if any(r.startswith(PREFIX) and r.endswith(":latest") for r in row["references"])
            }
            report = images.prune(current)
    except HarnessRLError as exc:
        raise _fail(exc) from exc
    typer.echo(json.dumps(report))
