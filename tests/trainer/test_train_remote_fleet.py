"""``trainer.gateway_url``: a run that serves no gateway drives one started elsewhere (``RemoteFleet``):
rollouts through that gateway, harnesses from an external controller, weights loaded into the
remote servers by the trainer itself, and the version told to the gateway on every resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"
HARNESSRL = [sys.executable, "-m", "harnessrl"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def test_config_names_what_a_remote_fleet_needs(tmp_path):
    proc = subprocess.run(
        [*HARNESSRL, "train", str(CONFIG), "--set", f"run.dir={tmp_path / 'run'}",
         "--set", "trainer.gateway_url=http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    for field in ("trainer.controllers", "store.url", "engine.model", "gateway.admin_key"):
        assert field in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing half-created


@pytest.mark.slow
def test_train_drives_a_gateway_started_elsewhere(tmp_path):
    from tests.fakes.vllm_server import serve_vllm

    from harnessrl.client import GatewayClient
    from harnessrl.config import EngineConfig, GatewayConfig
    from harnessrl.engines.factory import create_engine
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.gateway.app import create_app
    from harnessrl.gateway.server import serve_in_thread
    from harnessrl.store import open_store
    from harnessrl.tokenizer import PolicyTokenizer

    key = "hrl-admin-remote-fleet"
    store_path = tmp_path / "shared.db"
    tok = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    with serve_vllm(tok.encode("aeiou") + [tok.eos_token_id], context_length=2048) as upstream:
        engine_cfg = EngineConfig(model=f"vllm:{upstream.url}", tokenizer="tiny")
        gateway_store = open_store(str(store_path))
        app = create_app(GatewayConfig(admin_key=key), gateway_store, create_engine(engine_cfg))
        with serve_in_thread(app) as gateway_url:
            run_dir = tmp_path / "run"
            trainer = subprocess.Popen(
                [*HARNESSRL, "train", str(CONFIG), "--set", f"run.dir={run_dir}",
                 "--set", "metrics.progress=false", "--set", "trainer.mode=sync", "--set", "trainer.steps=2",
                 "--set", "trainer.controllers=external", "--set", f"trainer.gateway_url={gateway_url}",
                 "--set", f"store.url={store_path}", "--set", f"gateway.admin_key={key}",
                 "--set", f"engine.model=vllm:{upstream.url}", "--set", "engine.tokenizer=tiny",
                 "--set", "trainer.model=tiny", "--set", "trainer.served_weights_tolerance=0"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            controller = subprocess.Popen(
                [*HARNESSRL, "controller", "--config", str(CONFIG), "--store", str(store_path),
                 "--gateway-url", gateway_url, "--run-dir", str(tmp_path / "controller")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                out, err = trainer.communicate(timeout=420)
                assert trainer.returncode == 0, err[-3000:]
                assert json.loads(out.strip().splitlines()[-1])["steps"] == 2
                state = GatewayClient(gateway_url, key).state()
            finally:
                for proc in (trainer, controller):
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
                        try:
                            proc.wait(timeout=30)
                        except subprocess.TimeoutExpired:
                            proc.kill()
        gateway_store.close()
        reloads = [body for path, body in upstream.fake.calls if path == "/collective_rpc"]
    # The trainer loaded each step's weights into the server itself; the gateway adopted the version.
    assert [Path(r["kwargs"]["weights_path"]).name for r in reloads] == ["v1", "v2"]
    assert state["policy_version"] == 2 and state["paused"] is False
    store = SQLiteStore(store_path)
    try:
        by_step: dict[int, set[int]] = {}
        for r in store.list_rollouts(run_id="tiny-vowels"):
            versions = {c.policy_version for c in store.list_calls(r.rollout_id)}
            by_step.setdefault(r.metadata["trained_at_step"], set()).update(versions)
        assert by_step == {1: {0}, 2: {1}}  # sync: step 2 sampled from the reloaded servers
    finally:
        store.close()
    assert not (run_dir / "rollouts").exists()  # the controller, not the run, launched the harnesses
    assert len(list((tmp_path / "controller").rglob("stdout.log"))) >= 2 * 4 * 8
