"""Benchmark inference through the gateway: proxy overhead, cold start from zero, scale-out.

The stack: nats-server, the object store, a served gateway (granian), an in-process coordinator and
one real agent, all on this host. The endpoint serves all-MiniLM-L6-v2 with the sentence-transformers
engine (``engine: cpu``) by default, or with ``--chat`` SmolLM2-135M-Instruct on vLLM-CPU.

* **Overhead.** ``--requests`` small requests one at a time, alternating between the replica's own
  address (the baseline, same run) and the gateway; ``overhead_p50_ms`` / ``overhead_p99_ms`` are the
  differences of the percentiles (the p99 difference is within the replica's own jitter on a shared
  host, and can come out negative: both p99s are printed), ``throughput_ratio`` is the gateway's
  sequential request rate over the direct one.
* **Cold start.** The endpoint scales to zero after 10 idle seconds; then one request: the time from
  sending it to its first token (its whole answer, for an embedding) is a cold start, split into
  phases (:mod:`ops.bench.coldstart`). ``--cold-starts`` samples (3 by default) with the agent's warm
  engine waiting give ``cold_start_s`` (their median) and ``wake_s`` (the median engine phase: from
  the engine taking its command to answering its health check); then the agent is restarted with
  ``--warm-engines 0`` and one more sample, in the same run, gives ``cold_start_unwarmed_s``.
* **Scale-out.** With ``target_rps_per_replica`` 2 and ``max_replicas`` 2, a load step of ~6
  requests a second (at most :data:`MAX_IN_FLIGHT` at once): ``scale_out_s`` is from the step to
  the second replica ready (the autoscaler sees the last 10 s of load).

Usage: ``python -m ops.bench.inference [--quick] [--chat] [--requests N] [--cold-starts N] [--warm N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from agent.settings import default_work_dir
from core.log import EventLog
from gateway.queueing import percentile
from ops.bench import coldstart
from ops.bench.common import emit, machine, median, process_peak_rss_mb, table
from ops.bench.servedstack import REPO, ServedStack, create_tenants, served_stack
from ops.coordinator import running
from ops.enrollment import enroll_state_dir
from ops.process import spawn, terminate
from ops.services import intake
from projections import ENDPOINTS
from projections.runner import rebuild

READY_S = 900.0
MAX_IN_FLIGHT = 8
"""The load step's concurrency cap: a vLLM-CPU replica answers ~1 completion a second here, and
requests sent 6 a second without a cap piled up by the hundred on the cores the new replica needs."""


class BenchAgent:
    """The benchmark's one agent process (enrolled as the operator), which it may restart."""

    def __init__(self, stack: ServedStack, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        self.env.update(
            RESONTECH_NATS_URL=stack.settings.nats_url, RESONTECH_DATA_DIR=str(tmp), PYTHONPATH=str(REPO)
        )
        self.proc: Any = None
        self.log_path = tmp / "agent.log"
        self.work_dir = default_work_dir(tmp / "agent")

    def start(self, warm_engines: int) -> None:
        argv = [sys.executable, "-m", "ops.cli", "agent", "--name", "bench-1", "--state-dir",
                str(self.tmp / "agent"), "--heartbeat", "1", "--warm-engines", str(warm_engines)]  # fmt: skip
        self.proc = spawn(argv, self.log_path, self.env)

    def stop(self) -> None:
        terminate(self.proc, 15.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.asynccontextmanager
async def agent_and_coordinator(
    stack: ServedStack, tmp: Path, warm_engines: int = 1
) -> AsyncIterator[BenchAgent]:
    """One agent process with an in-process intake and coordinator."""
    await asyncio.to_thread(enroll_state_dir, stack.settings, tmp / "agent")
    agent = BenchAgent(stack, tmp)
    agent.start(warm_engines)
    try:
        async with (
            intake.running(stack.settings, name="bench-intake"),
            running(stack.settings, name="bench-coordinator"),
        ):
            yield agent
    finally:
        await asyncio.to_thread(agent.stop)


async def endpoint_body(http: httpx.AsyncClient, key: str, endpoint_id: str) -> dict[str, Any]:
    return dict(
        (await http.get(f"/v1/endpoints/{endpoint_id}", headers={"authorization": f"Bearer {key}"})).json()
    )


async def wait_for(http: httpx.AsyncClient, key: str, endpoint_id: str, check: Any, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check(await endpoint_body(http, key, endpoint_id)):
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise RuntimeError(f"endpoint {endpoint_id} did not get there in {timeout:g}s")


def request_of(chat: bool, name: str, i: int) -> tuple[str, dict[str, Any]]:
    if chat:
        body = {"model": name, "prompt": f"Count to {i % 5 + 1}:", "max_tokens": 1, "temperature": 0}
        return "/v1/completions", body
    return "/v1/embeddings", {"model": name, "input": f"benchmark sentence {i}", "encoding_format": "float"}


async def replica_key(stack: ServedStack, address: str) -> str:
    """The key of the replica at ``address``, from the kernel's endpoint table (the benchmark reads
    the log as the kernel: the baseline calls the replica directly, as only the gateway may)."""
    async with await EventLog.connect(stack.settings, name="bench-inference-keys") as event_log:
        table, _ = await rebuild(event_log, ENDPOINTS)
    replicas = [r for e in table.endpoints.values() for r in e.replicas.values()]
    return next(r.api_key for r in replicas if r.address == address)


async def overhead(
    http: httpx.AsyncClient, key: str, address: str, replica_key: str, chat: bool, n: int
) -> dict[str, float]:
    direct, proxied = [], []
    headers = {"authorization": f"Bearer {key}"}
    keyed = {"authorization": f"Bearer {replica_key}"}
    async with httpx.AsyncClient(base_url=address, timeout=120.0, headers=keyed) as replica:
        for i in range(n):
            path, body = request_of(chat, "bench", i)
            t0 = time.perf_counter()
            assert (await replica.post(path, json=body)).status_code == 200
            t1 = time.perf_counter()
            assert (await http.post(path, json=body, headers=headers)).status_code == 200
            t2 = time.perf_counter()
            direct.append(t1 - t0)
            proxied.append(t2 - t1)
    direct.sort()
    proxied.sort()
    return {
        "direct_p50_ms": percentile(direct, 0.5) * 1000,
        "gateway_p50_ms": percentile(proxied, 0.5) * 1000,
        "direct_p99_ms": percentile(direct, 0.99) * 1000,
        "gateway_p99_ms": percentile(proxied, 0.99) * 1000,
        "overhead_p50_ms": (percentile(proxied, 0.5) - percentile(direct, 0.5)) * 1000,
        "overhead_p99_ms": (percentile(proxied, 0.99) - percentile(direct, 0.99)) * 1000,
        "throughput_ratio": sum(direct) / sum(proxied),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = "smollm2-135m-instruct" if args.chat else "all-MiniLM-L6-v2"
    figures: dict[str, Any] = {
        "bench": "inference",
        "model": model,
        "engine": "vllm-cpu" if args.chat else "st",
    }
    with tempfile.TemporaryDirectory(prefix="rt-bench-inf-") as tmp:
        async with served_stack() as stack, agent_and_coordinator(stack, Path(tmp), args.warm) as agent:
            ((_, key),) = await create_tenants(stack, 1)
            headers = {"authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=stack.url, timeout=300.0) as http:
                spec = {
                    "name": "bench",
                    "model": model,
                    "max_replicas": 2,
                    "target_rps_per_replica": 2.0,
                    "scale_to_zero_after_s": 10,
                    **({} if args.chat else {"engine": "cpu"}),
                }
                created = (await http.post("/v1/endpoints", json=spec, headers=headers)).json()
                endpoint_id = created["endpoint_id"]
                figures["first_ready_s"] = await wait_for(
                    http, key, endpoint_id, lambda e: e["ready_replicas"] >= 1, READY_S
                )
                body = await endpoint_body(http, key, endpoint_id)
                address = next(r["address"] for r in body["replicas"] if r["state"] == "ready")
                secret = await replica_key(stack, address)
                figures.update(await overhead(http, key, address, secret, args.chat, args.requests))
                figures.update(await cold_starts(http, stack, key, endpoint_id, agent, args))
                figures["scale_out_s"] = await scale_out(http, key, endpoint_id, args.chat)
            figures["agent_peak_rss_mb"] = process_peak_rss_mb(agent.proc.pid)
    figures.update(machine())
    return figures


async def cold_start(
    http: httpx.AsyncClient,
    stack: ServedStack,
    key: str,
    endpoint_id: str,
    agent: BenchAgent,
    args: Any,
    n: int,
) -> dict[str, Any]:
    """One cold start from zero (:func:`ops.bench.coldstart.sample`), once the engine stopped and,
    where the agent keeps one, a warm engine imported."""
    await wait_for(http, key, endpoint_id, lambda e: e["state"] == "scaled_to_zero", 180.0)
    await asyncio.sleep(2.0)  # the replica's engine is stopped
    if args.warm:
        await coldstart.warm_engine_waiting(agent.work_dir)
    path, body = request_of(args.chat, "bench", n)
    if args.chat:
        body = {**body, "stream": True}
    figures = await coldstart.sample(http, stack.settings, key, endpoint_id, (path, body), agent.log)
    print(
        f"cold start {n}: "
        + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()),
        flush=True,
    )
    return figures


async def cold_starts(
    http: httpx.AsyncClient, stack: ServedStack, key: str, endpoint_id: str, agent: BenchAgent, args: Any
) -> dict[str, Any]:
    """``args.cold_starts`` cold starts as the agent runs, then one with no warm engine (same run)."""
    samples = [
        await cold_start(http, stack, key, endpoint_id, agent, args, n) for n in range(args.cold_starts)
    ]
    figures: dict[str, Any] = {
        "cold_start_s": median([s["total_s"] for s in samples]),
        "cold_starts_s": [round(s["total_s"], 2) for s in samples],
        "cold_starts_warm": sum(bool(s["warm"]) for s in samples),
    }
    for phase in ("scale_s", "place_s", "agent_s", "engine_s", "first_token_s"):
        figures[f"phase_{phase}"] = median([s.get(phase, float("nan")) for s in samples])
    if args.warm:
        figures["wake_s"] = median([s["engine_s"] for s in samples if s["warm"]] or [float("nan")])
        await asyncio.to_thread(agent.stop)
        agent.start(0)
        unwarm = argparse.Namespace(**{**vars(args), "warm": 0})
        unwarmed = await cold_start(http, stack, key, endpoint_id, agent, unwarm, args.cold_starts)
        figures["cold_start_unwarmed_s"] = unwarmed["total_s"]
        figures["unwarmed_engine_s"] = unwarmed.get("engine_s", float("nan"))
        figures["cold_start_speedup"] = unwarmed["total_s"] / figures["cold_start_s"]
        await asyncio.to_thread(agent.stop)
        agent.start(args.warm)
    return figures


async def scale_out(http: httpx.AsyncClient, key: str, endpoint_id: str, chat: bool) -> float:
    """Send ~6 requests a second until a second replica is ready; seconds from the step."""
    headers = {"authorization": f"Bearer {key}"}
    stop = asyncio.Event()

    sent: set[asyncio.Task[Any]] = set()

    async def load() -> None:
        i = 0
        while not stop.is_set():
            if len(sent) >= MAX_IN_FLIGHT:  # a client pool, not an unbounded pile-up on 2 cores
                await asyncio.sleep(0.05)
                continue
            path, body = request_of(chat, "bench", i)
            task = asyncio.create_task(http.post(path, json=body, headers=headers))
            sent.add(task)
            task.add_done_callback(sent.discard)
            i += 1
            await asyncio.sleep(1 / 6)

    task = asyncio.create_task(load())
    try:
        return await wait_for(http, key, endpoint_id, lambda e: e["ready_replicas"] >= 2, READY_S)
    finally:
        stop.set()
        await task
        await asyncio.gather(*sent, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (finishes sooner)")
    parser.add_argument("--chat", action="store_true", help="SmolLM2 on vLLM-CPU instead of MiniLM")
    parser.add_argument("--requests", type=int, default=0, help="overhead requests (default 300, quick 60)")
    parser.add_argument("--cold-starts", type=int, default=3, help="cold starts sampled (default 3)")
    parser.add_argument("--warm", type=int, default=1, help="the agent's warm engines (default 1; 0: none)")
    args = parser.parse_args()
    args.requests = args.requests or (60 if args.quick else 300)
    figures = asyncio.run(run(args))
    rows = [("figure", "value")] + [
        (k, f"{v:.3f}" if isinstance(v, float) else str(v)) for k, v in figures.items()
    ]
    print(table(rows))
    emit(figures)


if __name__ == "__main__":
    main()
