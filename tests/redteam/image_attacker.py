"""An agent that turns its task's image against the sandbox (``test_image_attacks.py``).

Run by ``harnessrl rollout`` (preset ``python``) as an ordinary harness whose task names the attack
image (``tests/redteam/image/Containerfile``). It tries what an image makes possible and prints one
JSON line ``{"image_attacks": [{"attack", "succeeded", "evidence"}]}``; success means the attack
worked. Standard library only.
"""

import json
import os
import pwd
import subprocess
import sys

REPORT = []


def record(name, succeeded, evidence=""):
    REPORT.append({"attack": name, "succeeded": bool(succeeded), "evidence": str(evidence)[:300]})


def attack(name):
    def wrap(fn):
        try:
            succeeded, evidence = fn()
        except Exception as exc:  # the attack failed in an unexpected way: it did not succeed
            succeeded, evidence = False, f"{type(exc).__name__}: {exc}"
        record(name, succeeded, evidence)
        return fn

    return wrap


@attack("setuid_binary_gives_root")
def _():
    out = subprocess.run(["/usr/local/bin/suid-id", "-u"], capture_output=True, text=True, timeout=20)
    return out.stdout.strip() == "0", f"euid {out.stdout.strip()!r} {out.stderr.strip()[:100]}"


@attack("open_a_device_node_of_the_image")
def _():
    with open("/opt/devs/null", "wb") as f:
        f.write(b"x")
    return True, "wrote to the image's device node"


@attack("write_the_declared_volume")
def _():
    with open("/data/planted", "w") as f:
        f.write("x")
    return True, "wrote /data/planted"


@attack("write_into_the_image")
def _():
    with open("/usr/local/bin/planted", "w") as f:
        f.write("x")
    return True, "wrote /usr/local/bin/planted"


@attack("create_beside_the_image")
def _():
    os.mkdir("/planted")
    return True, "made /planted"


@attack("passwd_renames_the_sandbox_user")
def _():
    entry = pwd.getpwuid(os.getuid())
    return entry.pw_name == "evil" or entry.pw_gid == 0 or entry.pw_dir == "/opt/evil", str(entry)


@attack("image_env_reaches_the_harness")
def _():
    found = {k: os.environ[k] for k in ("LD_PRELOAD", "PYTHONPATH", "BASH_ENV") if k in os.environ}
    return bool(found), found or "none of LD_PRELOAD, PYTHONPATH, BASH_ENV"


@attack("sitecustomize_ran_in_the_harness")
def _():
    marker = os.path.join(os.environ["HOME"], "HIJACKED-sitecustomize")
    return os.path.exists(marker) or "sitecustomize" in sys.modules and "/opt/evil" in str(
        getattr(sys.modules["sitecustomize"], "__file__", "")
    ), marker


@attack("harness_interpreter_replaced")
def _():
    return sys.executable.startswith("/opt/evil") or not os.path.exists(sys.executable), sys.executable


@attack("loader_preloads_the_images_library")
def _():
    # The loader reads /etc/ld.so.preload for every program: a preload it cannot find is reported.
    out = subprocess.run(["/bin/true"], capture_output=True, text=True, timeout=20)
    visible = ""
    if os.path.exists("/etc/ld.so.preload"):
        with open("/etc/ld.so.preload") as f:
            visible = f.read().strip()
    return "preloaded" in out.stderr or bool(visible), f"stderr {out.stderr.strip()[:150]!r} file {visible!r}"


# What the agent's own tools get: the image's PATH, by design (the image is the task's environment).
# Reported, not an attack on the harness: its python3 is the image's wrapper.
tool = subprocess.run(["sh", "-c", "command -v python3"], capture_output=True, text=True, timeout=20)
print(json.dumps({"image_attacks": REPORT, "agent_python3": tool.stdout.strip(), "uid": os.getuid()}))
