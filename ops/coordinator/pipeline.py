"""Appends in flight: the coordinator's many appends of one step go out concurrently, a chunk at a time.

A step may decide thousands of placements or start commands; awaiting each acknowledgement before
deciding the next would cost a round trip apiece, and gathering them all at once would hold them all
in memory and starve the event loop. :func:`pipelined` keeps at most two chunks in flight and draws
the next appends (deciding them) while the earlier ones are acknowledged.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

APPEND_CHUNK = 512
"""Appends a step keeps in flight per chunk (at most two chunks): concurrent, memory bounded."""
CHUNK_S = 0.05
"""A chunk of appends goes out once producing it (deciding) took this long, even if smaller."""


async def pipelined(appends: Iterator[Awaitable[Any]]) -> list[Any]:
    """Await ``appends`` concurrently, a chunk at a time, starting the next chunk before awaiting
    the previous one: at most two chunks in flight. The iterator is advanced lazily, so the work
    that produces the appends (decisions) overlaps with the acknowledgements of earlier ones."""
    results: list[Any] = []
    inflight: deque[asyncio.Future[list[Any]]] = deque()
    async for batch in _chunks(appends):
        inflight.append(asyncio.gather(*batch))
        if len(inflight) > 1:
            results += await inflight.popleft()
    while inflight:
        results += await inflight.popleft()
    return results


async def _chunks(items: Iterator[Awaitable[Any]]) -> AsyncIterator[list[Awaitable[Any]]]:
    """``items`` in chunks of ``APPEND_CHUNK``, or fewer when producing them took ``CHUNK_S``: the
    event loop must get back to the acknowledgements before their time-out."""
    batch: list[Awaitable[Any]] = []
    started = time.monotonic()
    for item in items:
        batch.append(item)
        if len(batch) >= APPEND_CHUNK or time.monotonic() - started >= CHUNK_S:
            yield batch
            batch = []
            await asyncio.sleep(0)  # let acknowledgements and projection updates in
            started = time.monotonic()
    if batch:
        yield batch
