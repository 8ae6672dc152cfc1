"""``harnessrl data``: curate SWE-smith-style task sets (filter → calibrate → select → split).

Each command reads JSONL, writes JSONL, prints its report as one JSON line (the last stdout line)
and, with ``--report``, writes it to a file too. Only ``calibrate`` starts the rollout stack, and it
imports it lazily so the other commands stay fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from harnessrl.errors import HarnessRLError

if TYPE_CHECKING:
    from harnessrl.schemas import SamplingOverrides

app = typer.Typer(
    name="data",
    help="Curate SWE-smith-style task sets: filter, calibrate, select, split (JSONL in, JSONL out).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts name TOML sections ("[harness]"): not style tags
)

ReportOption = Annotated[Path | None, typer.Option(help="Also write the JSON report to this file")]


def _fail(exc: HarnessRLError) -> typer.Exit:
    typer.secho(f"harnessrl: error: {exc}", err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def _check_outputs(paths: dict[str, Path | None], inputs: dict[str, Path]) -> None:
    """Each output path (by the argument or option that named it) can be written, is none of the
    ``inputs`` (``filter in.jsonl out.jsonl --report in.jsonl`` overwrote the records it read), and
    no two of them are the same file (``split --train X --test X`` kept only the test records;
    ``--report`` equal to an output overwrote it): checked before the work, so a bad one costs
    nothing and leaves nothing behind."""
    from harnessrl.config import check_output_path
    from harnessrl.data.records import same_file
    from harnessrl.errors import ConfigError

    seen: dict[Path, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        check_output_path(path, option)
        for name, source in inputs.items():
            if same_file(path, source):
                raise ConfigError(
                    f"{option} is {name} ({str(path)!r}): writing it would replace the input the "
                    "command reads; give the output its own path"
                )
        resolved = path.resolve()  # links and ".." too: the file the command would write
        if resolved in seen:
            raise ConfigError(
                f"{option}: {str(path)!r} is the same file as {seen[resolved]}; give each output its own"
            )
        seen[resolved] = option


def _emit(report: dict[str, Any], path: Path | None) -> None:
    from harnessrl.data.records import write_report

    write_report(path, report)
    typer.echo(json.dumps(report))


@app.command("filter")
def filter_command(
    in_path: Annotated[Path, typer.Argument(metavar="IN", help="Raw records (JSONL)")],
    out_path: Annotated[Path, typer.Argument(metavar="OUT", help="Kept records (JSONL)")],
    max_tests: Annotated[
        int | None, typer.Option(help="Drop records with more FAIL_TO_PASS + PASS_TO_PASS tests")
    ] = None,
    dedupe_statements: Annotated[
        bool, typer.Option(help="Also drop records whose normalized problem statement was seen")
    ] = False,
    report: ReportOption = None,
) -> None:
    """Drop empty problem statements, missing image/branch, too many tests and duplicates."""
    from harnessrl.data.curate import filter_records
    from harnessrl.data.records import iter_records, write_records

    try:
        _check_outputs({"OUT": out_path, "--report": report}, {"IN": in_path})
        kept, summary = filter_records(
            iter_records(in_path), max_tests=max_tests, dedupe_statements=dedupe_statements
        )
        write_records(out_path, kept)  # a write error (a full disk) is one line too
        _emit({**summary, "in": str(in_path), "out": str(out_path)}, report)
    except HarnessRLError as exc:
        raise _fail(exc) from exc


@app.command("calibrate")
def calibrate_command(
    in_path: Annotated[Path, typer.Argument(metavar="IN", help="Filtered records (JSONL)")],
    out_path: Annotated[Path, typer.Argument(metavar="OUT", help="Records with a calibration field")],
    config: Annotated[
        Path, typer.Option(help="Rollout TOML: [engine], [harness], [evaluator], [controller]")
    ],
    k: Annotated[int, typer.Option(help="Rollouts per task")] = 4,
    run_dir: Annotated[
        Path | None, typer.Option(help="Folder for the store and rollout logs (default: a temp folder)")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config value: section.key=value")
    ] = None,
    report: ReportOption = None,
) -> None:
    """Run the policy K times per task through the rollout stack; record passes (reward >= 1).

    With a training config, every call samples as the run's training rollouts do ([trainer]
    temperature, top_p, max_tokens), whatever the harness asks.

    Resumable: tasks already calibrated (same K and sampling, no infrastructure failures) in OUT are
    skipped.
    """
    import logging
    import tempfile

    from harnessrl.cli.rollout import TRAIN_ONLY_SECTIONS, Terminated, load_rollout_config, run_stoppable
    from harnessrl.controller.stack import check_local_launch
    from harnessrl.data.calibrate import calibrate_file

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        _check_outputs({"OUT": out_path, "--report": report}, {"IN": in_path, "--config": config})
        if run_dir is not None:  # a file there is named now, not a traceback once the stack started
            from harnessrl.config import check_output_path
            from harnessrl.errors import ConfigError

            check_output_path(run_dir, "--run-dir", kind="folder")
            for option, path in (("OUT", out_path), ("--report", report)):
                # The run folder made there first, OUT's append (or the report) failed after the work.
                if path is not None and run_dir.resolve().is_relative_to(path.resolve()):
                    raise ConfigError(
                        f"--run-dir {str(run_dir)!r} is {option} ({str(path)!r}) or a folder under it: "
                        "give the run folder and the files their own paths"
                    )
        # A training config works too: calibrate with the harness and evaluator the run trains with.
        rollout_config = load_rollout_config(str(config), set_ or [], ignore=TRAIN_ONLY_SECTIONS)
        store = rollout_config.store
        check_local_launch(rollout_config, store.url if store is not None else None, "gateway.port")
        sampling = _training_sampling(config, set_ or [])
        folder = run_dir or Path(tempfile.mkdtemp(prefix="harnessrl-calibrate-"))
        try:
            # SIGTERM stops it as Ctrl-C does (it used to end the process at once, its image build
            # and harnesses left running, the build's scratch left in the image store).
            summary = run_stoppable(
                calibrate_file(rollout_config, in_path, out_path, k=k, run_dir=folder, sampling=sampling)
            )
        except BaseException:
            if run_dir is None and not any(folder.iterdir()):
                folder.rmdir()  # a temp folder of ours that nothing was written to: nothing half-created
            raise
        _emit({**summary, "in": str(in_path), "out": str(out_path)}, report)
    except HarnessRLError as exc:
        raise _fail(exc) from exc
    except (KeyboardInterrupt, Terminated) as exc:  # OUT keeps every finished task: the same command goes on
        typer.echo(
            f"interrupted; OUT keeps what is done, run the same command to go on: {out_path}", err=True
        )
        raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None


def _training_sampling(config: Path, overrides: list[str]) -> SamplingOverrides | None:
    """A training config's ``[trainer]`` sampling (temperature, top_p, max_tokens), as its training
    rollouts get it; None for a rollout config (the harness samples as it asks)."""
    from harnessrl.config import load_raw_config, validate_config
    from harnessrl.trainer.config import TrainerSection
    from harnessrl.trainer.schedule import train_sampling

    raw = load_raw_config(config, overrides)
    if "trainer" not in raw:
        return None
    return train_sampling(validate_config(TrainerSection, raw["trainer"], where="trainer"))


@app.command("select")
def select_command(
    in_path: Annotated[Path, typer.Argument(metavar="IN", help="Calibrated records (JSONL)")],
    out_path: Annotated[Path, typer.Argument(metavar="OUT", help="Selected records (JSONL)")],
    unsolvable: Annotated[int, typer.Option(help="Never-solved tasks to add")] = 0,
    seed: Annotated[int, typer.Option(help="Seed for choosing the never-solved tasks")] = 0,
    report: ReportOption = None,
) -> None:
    """Keep tasks with mixed outcomes (0 < passes < k) and add N never-solved ones."""
    from harnessrl.data.calibrate import check_calibration_finished
    from harnessrl.data.curate import select_records
    from harnessrl.data.records import read_records, write_records

    try:
        _check_outputs({"OUT": out_path, "--report": report}, {"IN": in_path})
        check_calibration_finished(in_path)
        kept, summary = select_records(read_records(in_path), unsolvable=unsolvable, seed=seed)
        write_records(out_path, kept)
        _emit({**summary, "in": str(in_path), "out": str(out_path)}, report)
    except HarnessRLError as exc:
        raise _fail(exc) from exc


@app.command("split")
def split_command(
    in_path: Annotated[Path, typer.Argument(metavar="IN", help="Selected records (JSONL)")],
    train: Annotated[Path, typer.Option(help="Training records (JSONL)")],
    test: Annotated[Path, typer.Option(help="Test records (JSONL)")],
    test_size: Annotated[int, typer.Option(help="Records in the test set")],
    seed: Annotated[int, typer.Option(help="Seed of the split")] = 0,
    no_repo_leakage: Annotated[
        bool,
        typer.Option(
            "--no-repo-leakage/--allow-repo-leakage",
            help="Keep every repository on one side (the test set may come out smaller)",
        ),
    ] = False,
    report: ReportOption = None,
) -> None:
    """Split into train and test sets by count, optionally without repository leakage."""
    from harnessrl.data.curate import split_records
    from harnessrl.data.records import json_line, read_records, write_files

    try:
        _check_outputs({"--train": train, "--test": test, "--report": report}, {"IN": in_path})
        train_records, test_records, summary = split_records(
            read_records(in_path), test_size=test_size, seed=seed, no_repo_leakage=no_repo_leakage
        )
        # Both or neither: a new train set beside an old test set would put records on both sides.
        write_files({train: map(json_line, train_records), test: map(json_line, test_records)})
        _emit({**summary, "in": str(in_path), "train_out": str(train), "test_out": str(test)}, report)
    except HarnessRLError as exc:
        raise _fail(exc) from exc
