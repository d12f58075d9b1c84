"""What one node of a JetStream cluster says about a stream, asked through that node alone.

A client pinned to one server (no reconnect, so never to another) sees: the stream's cluster info
(answered by the stream's leader, wherever it is), the server's own copy of the stream (``/jsz`` on
its monitoring port: the local store's sequences) and the stored messages (direct gets). A direct get
is answered by any current replica, local or not: to read one server's own copy, cut its routes
first (see ``fanout`` in :func:`read_ids`).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from core.wire import MSG_ID

DIRECT_BATCH = 1000
REQUEST_TIMEOUT_S = 5.0


class ViewError(Exception):
    """A server did not answer as expected; the message says what it said."""


async def pinned(url: str, name: str) -> NATS:
    """A NATS connection to exactly this server: no reconnect, so never to a discovered other one."""

    async def quiet(_: Exception) -> None:
        return None

    return await nats.connect(
        url, allow_reconnect=False, connect_timeout=5, name=name, error_cb=quiet, max_reconnect_attempts=0
    )


async def stream_info(nc: NATS, stream: str) -> dict[str, Any]:
    """``$JS.API.STREAM.INFO.<stream>``: config, state, and ``cluster`` (leader, replicas).

    Raises:
        ViewError: JetStream answered with an error.
    """
    msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=REQUEST_TIMEOUT_S)
    info: dict[str, Any] = json.loads(msg.data)
    if "error" in info:
        raise ViewError(f"stream info {stream}: {info['error']}")
    return info


async def step_down(nc: NATS, stream: str) -> None:
    """Ask the stream's leader to hand over to another replica (``$JS.API.STREAM.LEADER.STEPDOWN``).

    Raises:
        ViewError: JetStream answered with an error.
    """
    msg = await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=REQUEST_TIMEOUT_S)
    answer = json.loads(msg.data)
    if "error" in answer:
        raise ViewError(f"leader step-down of {stream}: {answer['error']}")


def all_current(info: dict[str, Any]) -> bool:
    """Whether the stream has a leader and every other replica is current with no lag."""
    cluster = info.get("cluster", {})
    replicas = cluster.get("replicas", [])
    return bool(cluster.get("leader")) and all(r.get("current") and not r.get("lag") for r in replicas)


def local_state(monitor_url: str, stream: str) -> dict[str, Any] | None:
    """The server's own copy of ``stream`` (``/jsz``): ``messages``, ``first_seq``, ``last_seq``...;
    ``None`` if it holds no replica. Blocking: call it in a thread."""
    with urllib.request.urlopen(f"{monitor_url}/jsz?streams=true", timeout=REQUEST_TIMEOUT_S) as response:
        jsz = json.load(response)
    for account in jsz.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                state: dict[str, Any] = detail["state"]
                return state
    return None


async def read_ids(nc: NATS, stream: str, last_seq: int, fanout: int = 1) -> list[tuple[int, str]]:
    """Every stored message's ``(sequence, Nats-Msg-Id)`` up to ``last_seq``, by batched direct gets
    through ``nc``'s server.

    Args:
        fanout: how many identical requests each batch is sent as; the first batch to come back whole
            is the answer. A server hands a client's request to a random member of the direct-get
            queue group, local or across a route: with its routes cut (a *sealed* read, see
            :mod:`tests.lab.partition_cases`) a request that went to a route is lost, and only the
            server's own replica can answer the others.

    Raises:
        ViewError: a batch came back with an error status, or no request of a batch was answered
            before ``last_seq`` (TimeoutError when none ended within the request time-out).
    """
    out: list[tuple[int, str]] = []
    start = 1
    while start <= last_seq:
        batch = await _direct_batch(nc, stream, start, fanout)
        if not batch:
            raise ViewError(f"direct get from {stream} at seq {start} returned nothing (last {last_seq})")
        out += [item for item in batch if item[0] <= last_seq]
        start = batch[-1][0] + 1
    return out


async def _direct_batch(nc: NATS, stream: str, start: int, fanout: int) -> list[tuple[int, str]]:
    """One batched direct get (``{"seq": start, "batch": N}``) sent ``fanout`` times: the messages of
    the first request whose end-of-batch status arrives."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[tuple[int, str]]] = loop.create_future()

    def collector() -> Any:
        got: list[tuple[int, str]] = []

        async def on_msg(msg: Msg) -> None:
            headers = msg.headers or {}
            status = headers.get("Status")
            if done.done():
                return
            if status in ("204", "404"):  # end of batch / nothing at or after start
                done.set_result(got)
            elif status is not None:
                done.set_exception(ViewError(f"direct get: {status} {headers.get('Description', '')}"))
            else:
                got.append((int(headers["Nats-Sequence"]), headers.get(MSG_ID, "")))

        return on_msg

    subs = [await nc.subscribe(nc.new_inbox(), cb=collector()) for _ in range(fanout)]
    try:
        request = json.dumps({"seq": start, "batch": DIRECT_BATCH}).encode()
        for sub in subs:
            await nc.publish(f"$JS.API.DIRECT.GET.{stream}", request, reply=sub.subject)
        return await asyncio.wait_for(done, REQUEST_TIMEOUT_S)
    finally:
        for sub in subs:
            await sub.unsubscribe()
