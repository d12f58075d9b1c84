"""Pure parts of token metering: usage read off responses and streams, the streaming request's
``include_usage``, the meter's ticks, and how the ledger counts them."""

from __future__ import annotations

import json
import time

import msgspec

from gateway.token_counts import SseUsage, ask_for_usage, tokens_of
from gateway.token_meter import TokenMeter, token_tick
from projections.endpoints import ReplicaRecord
from projections.ledger import LEDGER, evolve
from schemas.envelope import Recorded
from schemas.metering import UsageTick
from schemas.values import Gpu
from tests.support.projection_records import endpoint_record, worker_record

NOW_MS = 1_780_000_000_000


def _later_ms() -> int:
    """A minute from now: after the meter's counts, which take the wall clock."""
    return time.time_ns() // 1_000_000 + 60_000


def _sse(*documents: dict[str, object] | str) -> list[bytes]:
    return [f"data: {d if isinstance(d, str) else json.dumps(d)}\n\n".encode() for d in documents]


CHUNKS = _sse(
    {"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hello"}}]},
    {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)
USAGE_CHUNK = _sse(
    {"id": "c1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}
)[0]
DONE = _sse("[DONE]")[0]


def _through(usage: SseUsage, chunks: list[bytes]) -> bytes:
    return b"".join(usage.feed(c) for c in chunks) + usage.finish()


def test_usage_is_prompt_plus_completion_tokens_and_absent_usage_is_none() -> None:
    assert tokens_of(b'{"usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}') == 12
    assert tokens_of(b'{"data": [], "usage": {"prompt_tokens": 4, "total_tokens": 4}}') == 4  # embeddings
    assert tokens_of(b'{"choices": [], "usage": null}') is None
    assert tokens_of(b'{"error": {"message": "bad"}}') is None
    assert tokens_of(b"not json") is None


def test_a_stream_the_gateway_asked_usage_for_reaches_the_client_without_the_usage_chunk() -> None:
    upstream = [*CHUNKS, USAGE_CHUNK, DONE]
    usage = SseUsage(strip=True)
    assert _through(usage, upstream) == b"".join([*CHUNKS, DONE])
    assert usage.tokens == 12


def test_a_stream_the_client_asked_usage_for_passes_unchanged() -> None:
    upstream = [*CHUNKS, USAGE_CHUNK, DONE]
    usage = SseUsage(strip=False)
    assert _through(usage, upstream) == b"".join(upstream)
    assert usage.tokens == 12


def test_events_split_across_chunks_and_crlf_separators_are_whole_when_passed() -> None:
    whole = b"".join([*CHUNKS, USAGE_CHUNK, DONE]).replace(b"\n\n", b"\r\n\r\n")
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]  # cut everywhere, even in a separator
    usage = SseUsage(strip=True)
    passed = [usage.feed(p) for p in pieces]
    assert all(p == b"" or p.endswith(b"\r\n\r\n") for p in passed)  # never half an event
    assert b"".join(passed) + usage.finish() == whole.replace(USAGE_CHUNK.replace(b"\n\n", b"\r\n\r\n"), b"")
    assert usage.tokens == 12


def test_continuous_usage_counts_the_last_figure_and_an_unterminated_tail_is_passed() -> None:
    running = _sse(
        {"choices": [{"delta": {"content": "a"}}], "usage": {"prompt_tokens": 9, "completion_tokens": 1}},
        {"choices": [{"delta": {"content": "b"}}], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
    )
    usage = SseUsage(strip=False)
    tail = b'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}'
    assert _through(usage, [*running, tail]) == b"".join([*running, tail])
    assert usage.tokens == 11


def test_a_streaming_request_asks_for_usage_unless_the_client_did() -> None:
    body, added = ask_for_usage(b'{"model": "m", "stream": true, "messages": []}')
    assert added and json.loads(body)["stream_options"] == {"include_usage": True}
    own = b'{"model": "m", "stream": true, "stream_options": {"include_usage": true}}'
    assert ask_for_usage(own) == (own, False)
    options = {"include_usage": False, "continuous_usage_stats": True}
    body, added = ask_for_usage(
        json.dumps({"model": "m", "stream": True, "stream_options": options}).encode()
    )
    assert added and json.loads(body)["stream_options"] == {"include_usage": True}  # never continuous
    odd = b'{"model": "m", "stream": true, "stream_options": "yes"}'
    assert ask_for_usage(odd) == (odd, False)  # the engine refuses it, unchanged


ENDPOINT = endpoint_record(tenant="acme", endpoint_id="ep1", name="chat", model="m", pool="managed")
REPLICA = ReplicaRecord(assignment_id="ep1-s0-e1", worker_id="w1", slot=0, epoch=1, gpus=1)
WORKER = worker_record(
    worker_id="w1",
    provider="gpuco",
    hostname="h",
    gpus=[Gpu(index=0, model="NVIDIA H100 80GB HBM3", vram_total_mb=81920, vram_free_mb=81920)],
)


def test_the_meter_sums_tokens_per_replica_into_contiguous_ticks_with_unique_ids() -> None:
    meter = TokenMeter()
    later = _later_ms()
    meter.add(ENDPOINT, REPLICA, 12)
    meter.add(ENDPOINT, REPLICA, 30)
    meter.add(ENDPOINT, REPLICA, 0)
    ((subject, tick, event_id),) = meter.cut({"w1": WORKER}, later * 1_000_000)
    assert subject == f"meter.acme.w1.{REPLICA.assignment_id}.tokens" and event_id == f"{meter.source}-1"
    assert (tick.tokens, tick.work_kind, tick.work_id) == (42, "endpoint", "ep1")
    assert (tick.provider, tick.gpu_type, tick.pool, tick.source) == (
        "gpuco",
        "H100",
        "managed",
        meter.source,
    )
    assert tick.end_ms == later and tick.start_ms <= tick.end_ms
    meter.pending.clear()  # as a flush that stored it does
    meter.add(ENDPOINT, REPLICA, 5)
    (unstored,) = meter.cut({"w1": WORKER}, (later + 1) * 1_000_000)
    assert unstored[1].start_ms >= tick.end_ms and unstored[2] == f"{meter.source}-2"
    assert meter.cut({}, (later + 2) * 1_000_000) == [unstored]  # not stored yet: sent again, same id


def test_a_tick_is_at_least_a_millisecond_and_a_cpu_replica_is_priced_as_cpu() -> None:
    meter = TokenMeter()
    cpu_replica = msgspec.structs.replace(REPLICA, gpus=0)
    meter.add(ENDPOINT, cpu_replica, 3)
    counted = meter.counted[REPLICA.assignment_id]
    tick = token_tick(
        counted, WORKER, source="gateway-x", end_ms=counted.since_ms, now_ns=_later_ms() * 1_000_000
    )
    assert tick.end_ms == tick.start_ms + 1 and tick.gpu_type == "cpu"


def _recorded(seq: int, tick: UsageTick, subject: str = "meter.acme.w1") -> Recorded[UsageTick]:
    return Recorded(stream="METERING", seq=seq, subject=subject, time_ns=0, msg_id=f"m{seq}", event=tick)


def test_the_ledger_sums_the_gateways_tokens_on_the_replicas_line_and_ignores_an_agents() -> None:
    base = dict(
        work_id="ep1",
        work_kind="endpoint",
        assignment_id="ep1-s0-e1",
        epoch=1,
        provider="gpuco",
        gpu_type="H100",
        pool="shared",
        start_ms=NOW_MS,
        end_ms=NOW_MS + 10_000,
        tier="gold",
    )
    agent = UsageTick(**base, gpu_ms=10_000, tokens=999)  # type: ignore[arg-type]
    forged = UsageTick(**base, gpu_ms=10_000, tokens=999, source="gateway-b")  # type: ignore[arg-type]
    gateway_a = UsageTick(**base, tokens=40, source="gateway-a")  # type: ignore[arg-type]
    gateway_b = UsageTick(**base, tokens=2, source="gateway-b")  # type: ignore[arg-type]
    counted = "meter.acme.w1.tokens"
    state = LEDGER.initial()
    for seq, (tick, subject) in enumerate(
        [
            (agent, "meter.acme.w1"),
            (forged, "meter.acme.w1"),
            (gateway_a, counted),
            (gateway_b, counted),
            (gateway_a, counted),
        ],
        start=1,
    ):
        state = evolve(state, _recorded(seq, tick, subject))
    (line,) = state.lines.values()
    assert (line.gpu_ms, line.tokens, line.ticks, line.source_ranges) == (10_000, 42, 3, [(1, 1), (3, 4)])
    assert state.duplicates == 2  # the agent's tick sent again with a source, the retried gateway-a tick
    assert line.charge_micros == round(10_000 * 2_490_000 / 3_600_000)  # tokens are not priced
    assert state.workers["w1"].gpu_ms == 10_000
