"""Red team, image roots: the attacks an image makes possible, through ``harnessrl rollout`` with the real
sandbox over a real image (``tests/redteam/image/Containerfile``), each with its control on the host.

A task's image is data the sandbox was not written for: it may ship a setuid-root program, a device
node, a world-writable folder it declares as a volume, a ``/etc/passwd`` that renames the sandbox's
user, a loader preload list, and an environment (``PATH``, ``LD_PRELOAD``, ``PYTHONPATH``,
``BASH_ENV``) aimed at the harness, whose install is mounted from the host. Inside, every one of
them must fail (``image_attacker.py`` reports); each control shows on the host, over the same
mounted image, that the attack is real: the setuid program does give root, the device opens, the
volume is writable in an ordinary container, the loader does read the preload list, the image's
``PYTHONPATH`` does run its ``sitecustomize``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.environments.image_support import ATTACK, environment_toml, environments, needs_images

pytestmark = [needs_images, pytest.mark.slow]

ATTACKER = Path(__file__).with_name("image_attacker.py")
ATTACKS = {
    "setuid_binary_gives_root",
    "open_a_device_node_of_the_image",
    "write_the_declared_volume",
    "write_into_the_image",
    "create_beside_the_image",
    "passwd_renames_the_sandbox_user",
    "image_env_reaches_the_harness",
    "sitecustomize_ran_in_the_harness",
    "harness_interpreter_replaced",
    "loader_preloads_the_images_library",
}


@pytest.fixture(scope="module")
def attack_root():
    return environments().root(ATTACK, where="the attack image")


def test_every_image_attack_fails_inside_the_sandbox(tmp_path: Path, attack_root):
    (tmp_path / "script.json").write_text(json.dumps({"turns": ["unused"]}))
    config = tmp_path / "attack.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "script.json"}"\n\n'
        f'[harness]\npreset = "python"\ncommand = ["{ATTACKER}"]\ntimeout_s = 120\n\n'
        '[evaluator]\ntype = "command"\nreward_from = "exit_code"\ncommand = ["true"]\n\n'
        "[controller]\nmax_infra_retries = 0\n\n" + environment_toml(field="image_name")
    )
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"prompt": "attack", "task_id": "image-attack", "image_name": ATTACK}))
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config), "--task", f"@{task}"]
        + ["--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "finished", summary
    log = Path(summary["log"])
    line = next(x for x in (log / "stdout.log").read_text().splitlines() if x.startswith('{"image_attacks"'))
    report = json.loads(line)
    results = {a["attack"]: a for a in report["image_attacks"]}
    assert set(results) == ATTACKS
    worked = {name: r["evidence"] for name, r in results.items() if r["succeeded"]}
    assert worked == {}, f"image attacks that worked inside the sandbox: {worked}"
    assert report["uid"] == 1000
    # By design the agent's own tools come from the image's PATH (the task's environment): the
    # image's python3 wrapper; the harness's interpreter was the host's (checked above).
    assert report["agent_python3"] == "/opt/evil/bin/python3"
    assert "preloaded" not in (log / "stderr.log").read_text()
    assert not (log / "home" / "HIJACKED-sitecustomize").exists()


def test_control_each_image_attack_is_real_outside_the_sandbox(tmp_path: Path, attack_root):
    image = attack_root.path
    # setuid: run as uid 1000 on the host, the image's program runs with euid 0.
    suid = subprocess.run(
        [
            "setpriv",
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            str(image / "usr/local/bin/suid-id"),
            "-u",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert suid.stdout.strip() == "0"
    # The device node opens on the host (the image mount is not nodev).
    with open(image / "opt/devs/null", "wb") as f:
        f.write(b"x")
    # The declared volume is writable in an ordinary container of the image.
    assert "/data" in attack_root.volumes
    podman = environments().store.podman
    ran = podman.run(
        "run",
        "--rm",
        "--network=none",
        attack_root.image_id,
        "sh",
        "-c",
        "touch /data/x && echo wrote",
        timeout=120,
    )
    assert ran.stdout.strip() == "wrote"
    # The passwd entry, the preload list and the environment are in the image.
    assert "evil:x:1000:0:" in (image / "etc/passwd").read_text()
    env = attack_root.declared_env()
    assert env["LD_PRELOAD"] == "/opt/evil/libenv.so" and env["PYTHONPATH"] == "/opt/evil/py"
    # The loader reads the image's preload list: every program started in it says so.
    chrooted = subprocess.run(["chroot", str(image), "/bin/true"], capture_output=True, text=True)
    assert "ld.so.preload" in chrooted.stderr and "preloaded" in chrooted.stderr
    # The image's PYTHONPATH runs its sitecustomize in any Python that is given that environment.
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(
        [sys.executable, "-c", "pass"],
        env={"PYTHONPATH": str(image / "opt/evil/py"), "HOME": str(home)},
        check=True,
    )
    assert (home / "HIJACKED-sitecustomize").exists()
