"""``GatewayFleet`` over a ``LocalGateway``: the trainer pauses, updates and resumes the gateway it
serves in-process, with one pause and one resume per update (the gateway's order stamps count them),
and weights in the form the engine takes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harnessrl.config import GatewayConfig
from harnessrl.engines.base import WeightUpdate
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.errors import UpstreamError
from harnessrl.gateway.app import create_app
from harnessrl.gateway.control.gating import GatewayHandle
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store import open_store
from harnessrl.trainer.fleet import RolloutBook
from harnessrl.trainer.fleet_gateway import GatewayFleet, load_weights
from harnessrl.trainer.fleet_local import LocalGateway


class FolderWeights:
    """Weights that write a marker folder (what a server would load) or hand out a state dict."""

    def __init__(self) -> None:
        self.saved: list[Path] = []

    def engine_state_dict(self) -> dict[str, Any]:
        return {"w": 1.0}

    def save_adapter(self, folder: Path) -> bool:
        return False  # no [trainer.lora]: the whole weights go out

    def save_checkpoint(self, folder: Path, *, with_optimizer: bool = True) -> Path:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        self.saved.append(folder)
        return folder


@pytest.fixture
def gateway(tmp_path: Path):
    store = open_store(str(tmp_path / "store.db"))
    engine = ScriptedEngine(["hi"])  # stands in for shared remote servers (shares_weights)
    app = create_app(GatewayConfig(admin_key="k", pause_timeout_s=0.3), store, engine)
    with serve_in_thread(app) as url:
        yield GatewayHandle(app.state.gateway, url), store
    store.close()


def counter(handle: GatewayHandle) -> int:
    return handle.state.cluster.applied  # the store's command counter: +1 per pause or resume


def test_an_update_inside_a_pause_resumes_once_and_announces_the_version(gateway, tmp_path):
    handle, store = gateway
    fleet = GatewayFleet(
        RolloutBook(store, "run"), LocalGateway(handle), weights_root=tmp_path / "engine-weights"
    )
    weights = FolderWeights()
    before = counter(handle)

    async def main() -> None:
        async with fleet.paused():
            assert handle.state.gate.paused
            await fleet.publish(1, weights)
            assert handle.state.gate.paused  # still held: the outer pause resumes
        assert not handle.state.gate.paused
        await fleet.publish(2, weights)  # outside a pause: pauses and resumes around the swap

    asyncio.run(main())
    assert counter(handle) - before == 4  # (pause, resume) twice: no second resume per update
    assert handle.engine.policy_version == 2 and not handle.state.gate.paused
    assert [f.name for f in weights.saved] == ["v1", "v2"]
    assert [p.name for p in (tmp_path / "engine-weights").iterdir()] == ["v2"]  # v1 removed once loaded


def test_a_pause_that_does_not_drain_reopens_the_gate_and_refuses(gateway, tmp_path):
    handle, store = gateway
    fleet = GatewayFleet(RolloutBook(store, "run"), LocalGateway(handle), weights_root=tmp_path / "w")

    async def hold_a_call() -> Any:
        return handle.state.gate.join()  # an admitted call that never ends

    async def main() -> None:
        ticket = await handle.run(hold_a_call)
        with pytest.raises(UpstreamError, match="did not drain"):
            async with fleet.paused():
                pytest.fail("entered a pause with a call in flight")
        assert not handle.state.gate.paused  # generation goes on; weights were not touched

        async def end_the_call() -> None:
            ticket.release()

        await handle.run(end_the_call)

    asyncio.run(main())
    assert handle.engine.policy_version == 0


def test_load_weights_gives_an_in_process_engine_the_state_dict(tmp_path):
    updates: list[WeightUpdate] = []

    async def update(u: WeightUpdate) -> None:
        updates.append(u)

    weights = FolderWeights()
    asyncio.run(load_weights(update, False, 3, weights, tmp_path / "w"))
    assert updates[0].version == 3 and updates[0].state_dict == {"w": 1.0}
    assert updates[0].checkpoint_dir is None and not weights.saved
    asyncio.run(load_weights(update, True, 4, weights, tmp_path / "w"))
    assert updates[1].checkpoint_dir == str(tmp_path / "w" / "v4") and updates[1].state_dict is None


def test_a_restored_checkpoint_may_rewind_the_version_and_nothing_else_may(gateway, tmp_path):
    from harnessrl.errors import Conflict

    handle, store = gateway
    fleet = GatewayFleet(RolloutBook(store, "run"), LocalGateway(handle), weights_root=tmp_path / "w")
    weights = FolderWeights()

    async def main() -> None:
        await fleet.publish(5, weights)
        # A --resume from the checkpoint of step 3 (step 4's and 5's were never written whole):
        await fleet.publish(3, weights, restore=True)
        assert handle.engine.policy_version == 3 and not handle.state.gate.paused
        # Control: without saying so, nothing may take the gateways back a version.
        with pytest.raises(Conflict, match="never go backwards"):
            await handle.resume(policy_version=2)

    asyncio.run(main())


def test_an_in_process_engine_frees_its_weights_for_the_step_and_the_publish_refills_them(tmp_path):
    torch = pytest.importorskip("torch")
    from harnessrl.engines.base import SamplingParams, each_sample
    from harnessrl.engines.embedded import EmbeddedEngine
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.trainer.policy import TrainablePolicy

    tiny_dir = tiny_model_dir()
    store = open_store(str(tmp_path / "store.db"))
    engine = EmbeddedEngine(tiny_dir, max_batch_size=2)
    app = create_app(GatewayConfig(admin_key="k", pause_timeout_s=0.3), store, engine)
    policy = TrainablePolicy(tiny_dir)
    with torch.no_grad():  # the step's update, as the trainer would make it
        for p in policy.model.parameters():
            p.add_(0.01)
    prompt = engine.tokenizer.encode("Vowels, please:")
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=0)

    async def generate() -> list:
        return [s async for s in each_sample(engine.generate(prompt, params))]

    async def main() -> None:
        await engine.start()
        fleet = GatewayFleet(RolloutBook(store, "run"), LocalGateway(handle), weights_root=tmp_path / "w")
        async with fleet.paused():
            assert await fleet.release_engine_weights()
            assert all(p.untyped_storage().nbytes() == 0 for p in engine.model.parameters())
            with pytest.raises(UpstreamError, match="released"):
                await generate()
            await fleet.publish(1, policy)
        sampled = await handle.run(generate)
        assert engine.policy_version == 1
        # the engine serves the published weights: its logprobs are the policy's own
        want = policy.response_logprobs(prompt, [s.token_id for s in sampled])
        torch.testing.assert_close(
            torch.tensor([s.logprob for s in sampled]), torch.tensor(want), atol=1e-4, rtol=0
        )
        await engine.aclose()

    with serve_in_thread(app) as url:
        handle = GatewayHandle(app.state.gateway, url)
        asyncio.run(main())
    store.close()
