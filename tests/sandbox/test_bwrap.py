"""The bubblewrap sandbox: its command line (a pure function), the refusals before anything starts
(no bwrap, a mount that would expose the run folder), ``harnessrl sandbox check``, and the evaluator's
defence against links out of the workspace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.sandbox.bwrap import (
    GATEWAY_SOCKET,
    INIT_PATH,
    INIT_STATUS_FD,
    Layout,
    bwrap_argv,
    check_mounts,
    sandbox_problem,
)
from harnessrl.sandbox.copy import drop_escaping_links
from harnessrl.sandbox.seccomp import DENIED_SYSCALLS, compile_filter

HARNESSRL = [sys.executable, "-m", "harnessrl"]
needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"
)


def layout(tmp_path: Path, **kwargs) -> Layout:
    values = dict(
        command=["agent", "--go"],
        cwd=tmp_path / "ws",
        env={"HOME": str(tmp_path / "home"), "OPENAI_API_KEY": "rollout-key"},
        etc_dir=tmp_path / "etc",
        writable=(tmp_path / "ws", tmp_path / "home"),
        read_only=(Path(sys.prefix),),
        gateway_port=8123,
        gateway_socket="/tmp/hrl-x/gw.sock",
    )
    values.update(kwargs)
    return Layout(**values)


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_argv_unshares_everything_and_drops_privileges(tmp_path):
    argv = bwrap_argv(layout(tmp_path), bwrap="/usr/bin/bwrap")
    assert argv[0] == "/usr/bin/bwrap"
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--share-net" not in argv
    assert argv[argv.index("--uid") + 1] == "1000" and argv[argv.index("--cap-drop") + 1] == "ALL"
    assert "--clearenv" in argv and ("OPENAI_API_KEY", "rollout-key") in pairs(argv, "--setenv")


def test_argv_binds_only_what_is_listed(tmp_path):
    argv = bwrap_argv(layout(tmp_path))
    writable = {src for src, _ in pairs(argv, "--bind")}
    assert writable == {str(tmp_path / "ws"), str(tmp_path / "home")}
    read_only = dict(pairs(argv, "--ro-bind"))
    assert read_only["/usr"] == "/usr" and read_only[str(tmp_path / "etc" / "passwd")] == "/etc/passwd"
    assert read_only["/tmp/hrl-x/gw.sock"] == GATEWAY_SOCKET
    assert not any(src in ("/", "/root", "/home", "/work", "/etc") for src in read_only)
    assert ("/tmp" in argv[argv.index("--tmpfs") + 1]) and "--proc" in argv and "--dev" in argv
    # The command runs under init.py, which relays the gateway port to the bound socket.
    tail = argv[argv.index("--") + 1 :]
    assert tail[1:] == [
        "-I",
        "-S",
        INIT_PATH,
        "8123",
        GATEWAY_SOCKET,
        str(INIT_STATUS_FD),
        "--",
        "agent",
        "--go",
    ]


def test_argv_for_no_network_relays_nothing(tmp_path):
    argv = bwrap_argv(layout(tmp_path, network="none"))
    assert GATEWAY_SOCKET not in dict(pairs(argv, "--ro-bind")).values()
    tail = argv[argv.index("--") + 1 :]
    assert tail[tail.index(INIT_PATH) + 1] == "0"


def test_argv_host_network_shares_it(tmp_path):
    assert "--share-net" in bwrap_argv(layout(tmp_path, network="host"))


def test_a_bind_under_an_already_bound_folder_is_not_repeated(tmp_path):
    argv = bwrap_argv(
        layout(tmp_path, read_only=(Path("/usr/lib"), Path(sys.prefix), Path(sys.prefix) / "bin"))
    )
    sources = [src for src, _ in pairs(argv, "--ro-bind")]
    assert "/usr/lib" not in sources and str(Path(sys.prefix) / "bin") not in sources


def test_seccomp_filter_compiles_and_denies_the_escape_calls():
    program = compile_filter()
    assert len(program) % 8 == 0 and len(program) > 100  # struct sock_filter is 8 bytes
    assert {"setns", "mount", "pivot_root", "ptrace", "process_vm_readv", "process_vm_writev", "bpf"} <= set(
        DENIED_SYSCALLS
    ) and {"keyctl", "perf_event_open", "unshare"} <= set(DENIED_SYSCALLS)


@pytest.mark.parametrize(
    ("mount", "exposes"),
    [("{run}", "run"), ("{run}/rollouts", "run"), ("{parent}", "run"), ("{run}/harnessrl.db", "run")],
)
def test_a_mount_exposing_the_run_folder_is_refused(tmp_path, mount, exposes):
    run = tmp_path / "run"
    run.mkdir()
    path = mount.format(run=run, parent=tmp_path)
    with pytest.raises(ConfigError, match=r"harness.mounts\[1\].*would expose"):
        check_mounts(["/usr/share", path], forbidden=[run])
    check_mounts(["/usr/share", str(tmp_path / "elsewhere")], forbidden=[run])  # a sibling is fine


def test_a_relative_mount_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"harness.mounts\[0\].*absolute"):
        check_mounts(["data"], forbidden=[tmp_path])


def test_links_out_of_the_workspace_are_dropped_and_links_within_kept(tmp_path):
    root = tmp_path / "copy"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "real.py").write_text("x")
    (root / "inside").symlink_to("pkg/real.py")
    (root / "pkg" / "up").symlink_to("../pkg")
    (root / "gold").symlink_to(tmp_path / "hidden" / "gold.txt")
    (root / "etc").symlink_to("/etc")
    (root / "sneaky").symlink_to("../copy/../hidden")
    dropped = {p.name for p in drop_escaping_links(root)}
    assert dropped == {"gold", "etc", "sneaky"}
    assert (root / "inside").is_symlink() and (root / "pkg" / "up").is_symlink()


# -- refusals before anything starts, through the CLI ---------------------------------------------


def rollout_cli(
    tmp_path: Path, harness_extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    config = tmp_path / "rollout.toml"
    config.write_text(
        f"""
[engine]
model = "tiny"

[harness]
command = ["/bin/true"]
{harness_extra}
"""
    )
    (tmp_path / "task.json").write_text(json.dumps({"prompt": "hi", "hidden": {"answer": "x"}}))
    return subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", f"@{tmp_path / 'task.json'}"]
        + ["--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_rollout_refuses_to_start_without_bubblewrap(tmp_path):
    proc = rollout_cli(tmp_path, "", env={"HARNESSRL_BWRAP": "/nonexistent/bwrap"})
    assert proc.returncode == 2
    assert (
        "harness.sandbox" in proc.stderr and "bubblewrap" in proc.stderr and 'sandbox = "none"' in proc.stderr
    )
    assert not (tmp_path / "run").exists()  # nothing half-created


@needs_sandbox
def test_rollout_without_bubblewrap_runs_when_the_user_says_sandbox_none(tmp_path):
    proc = rollout_cli(tmp_path, 'sandbox = "none"', env={"HARNESSRL_BWRAP": "/nonexistent/bwrap"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_rollout_refuses_a_mount_that_exposes_the_run_folder(tmp_path):
    proc = rollout_cli(tmp_path, f'mounts = ["{tmp_path}"]')
    assert proc.returncode == 2 and "harness.mounts[0]" in proc.stderr and "would expose" in proc.stderr
    assert not (tmp_path / "run").exists()


@needs_sandbox
def test_sandbox_check_holds_here():
    proc = subprocess.run([*HARNESSRL, "sandbox", "check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NOT HELD" not in proc.stdout and proc.stdout.count("held") >= 12


def test_sandbox_check_says_what_is_missing():
    proc = subprocess.run(
        [*HARNESSRL, "sandbox", "check"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HARNESSRL_BWRAP": "/nonexistent/bwrap"},
    )
    assert proc.returncode == 1 and "NOT HELD" in proc.stdout and "bubblewrap" in proc.stdout
