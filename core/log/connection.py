"""The log's connection to NATS: connecting with the deployment's credentials, the reply inbox that
JetStream acknowledges appends on, the publish path every append takes, a stream's bounds, moving
away from a silent node, and closing without dropping an append in flight.

:class:`LogConnection` is the one base class of :class:`core.log.EventLog`; the other modules of
the package are given what they use of it (its JetStream context, its publish path, its node
check) rather than inheriting it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Self

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.client import Server
from nats.aio.msg import Msg
from nats.js import api

from core.errors import LogUnavailable
from core.log.acks import AckTracker
from core.log.frames import batch_frames
from core.log.group_commit import GroupCommit
from core.settings import Settings
from core.wire import Position

CONNECT_TIMEOUT_S = 5.0
RECONNECT_WAIT_S = 0.5
"""Pause before connecting again to a server that failed the last attempt."""
NODE_CHECK_S = 2.0
"""How long a node has to answer the check that decides whether a client moves away from it."""
AVOID_S = 60.0
"""How long a client that moved away from a node prefers the others (while one of them connects)."""
log = logging.getLogger("resontech.log")
UNANSWERED = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError)
"""What a read that needs the stream's leader gets while the stream has none (a cluster node died and
an election is on): the log is unavailable for now, as a caller that retries must be told."""
ELECTION_S = 12.0
"""How long a read waits for a stream's leader (an election takes 4-9 s after its node died): a read
just after a failover waits for the new leader."""


class Patience:
    """How long the log goes on asking while nothing answers, and the pauses in between: from
    ``first_s``, doubling up to ``max_s``, until ``seconds`` have passed. Each pause first tells
    ``silent`` (the connection's check of its node, :meth:`LogConnection._silent`), if given."""

    def __init__(
        self, seconds: float, *, first_s: float, max_s: float, silent: Callable[[], None] | None = None
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + seconds
        self._delay, self._max = first_s, max_s
        self._silent = silent

    async def wait(self) -> bool:
        """Pause before the next attempt; ``False`` (at once) when the patience is spent."""
        if self._silent is not None:
            self._silent()
        if self._loop.time() + self._delay > self._deadline:
            return False
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, self._max)
        return True


class Bounds(NamedTuple):
    """A stream's first and last sequence, as :meth:`LogConnection.stream_bounds` gives them."""

    first_seq: int
    last_seq: int


class LogConnection:
    """One NATS connection, its JetStream context and its acknowledgement inbox: the base of
    :class:`core.log.EventLog`, whose methods hand these to the package's functions.

    Appends are published with a reply subject on the log's own inbox and matched to their
    acknowledgements by :class:`core.log.acks.AckTracker` (see :mod:`core.log.acks` for why not nats-py's
    ``publish_async``). Appends to one stream that wait at the same moment go out as one atomic
    batch (:mod:`core.log.group_commit`) unless ``settings.group_commit`` is off.
    """

    def __init__(self, nc: NATS, settings: Settings) -> None:
        self._nc = nc
        self._js = nc.jetstream(
            timeout=settings.ack_timeout_s, prefix=settings.nats_js_api_prefix or api.DEFAULT_PREFIX
        )
        self.settings = settings
        self._acks = AckTracker(settings.ack_timeout_s)
        self._inbox = ""
        self._tokens = itertools.count(1)
        self._background: set[asyncio.Task[Any]] = set()
        self._group = GroupCommit(self._publish_now, self._publish_batch) if settings.group_commit else None
        self._acks.on_expired = self._silent
        self._may_move = len(settings.nats_url.split(",")) > 1 and not settings.nats_js_api_prefix
        """A kernel connection given several URLs (an agent's user may not ask for account info)."""
        self._checking = False
        self._next_check = 0.0
        self._avoid = ""
        self._avoid_until = 0.0

    @classmethod
    async def connect(cls, settings: Settings, *, name: str = "resontech") -> Self:
        """Connect to NATS with the settings' URL and credentials.

        Raises:
            LogUnavailable: the server cannot be reached within a few seconds.
        """
        options: dict[str, Any] = {
            "servers": settings.nats_url.split(","),
            "name": name,
            "connect_timeout": 3,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": RECONNECT_WAIT_S,
            "allow_reconnect": True,
        }
        chooser: list[LogConnection] = []  # the log is made once connected; its choice is the log's
        options["reconnect_to_server_handler"] = lambda servers, info: chooser[0]._choose_server(servers)
        if settings.nats_creds:
            options["user_credentials"] = settings.nats_creds
        if settings.nats_user:
            options["user"] = settings.nats_user
            options["password"] = settings.nats_password or ""
        if settings.nats_inbox_prefix:
            options["inbox_prefix"] = settings.nats_inbox_prefix

        async def _quiet(_: Exception) -> None:
            return None

        try:
            # Reconnects are unlimited once connected; the first connection gets a deadline, or
            # nats-py would retry an unreachable server forever.
            nc = await asyncio.wait_for(nats.connect(**options, error_cb=_quiet), timeout=CONNECT_TIMEOUT_S)
        except (OSError, nats.errors.Error, TimeoutError) as exc:
            reason = str(exc) or "no answer"
            raise LogUnavailable(f"cannot reach NATS at {settings.nats_url}: {reason}") from None
        connection = cls(nc, settings)
        chooser.append(connection)
        connection._inbox = nc.new_inbox() + "."
        await nc.subscribe(connection._inbox + "*", cb=connection._on_ack)
        return connection

    async def close(self) -> None:
        """Wait for outstanding appends (up to the ack time-out), then disconnect."""
        with contextlib.suppress(Exception):
            if self._group is not None:
                await self._group.drain()
            await self._wait_pending()
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await task
        self._acks.close()
        self._acks.fail_all(LogUnavailable("event log closed"))
        with contextlib.suppress(Exception):
            await self._nc.drain()
        if not self._nc.is_closed:
            # drain refuses a connection that is reconnecting (a server restarting, credentials
            # revoked): left so, nats-py would go on reconnecting forever after the log is closed
            try:
                await self._nc.close()
            except asyncio.CancelledError:
                # nats-py cancels its own transport's close waiter when it left that node: only a
                # cancellation of this task goes on
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
            except Exception:
                pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected_to(self) -> str:
        """``host:port`` of the NATS server this connection is on (empty while reconnecting)."""
        url = self._nc.connected_url
        return url.netloc if url is not None and self._nc.is_connected else ""

    def _silent(self) -> None:
        """Something sent got no answer: check the node (at most once per acknowledgement time-out).

        A node can keep its clients' connections and answer nothing: hung, or cut off from the
        other nodes (its clients then get no acknowledgement, or "no responders", and nats-py stays,
        as the connection itself is fine). If the node does not answer JetStream's account info
        either (a node without its cluster's meta leader says "temporarily unavailable"), the
        connection moves to another of its URLs. A stream electing a leader is not that: the node
        answers, and the client stays. Only a kernel connection given several URLs checks (an
        agent's user may not ask for account info).
        """
        now = time.monotonic()
        if not self._may_move or self._checking or now < self._next_check or not self._nc.is_connected:
            return
        self._checking = True
        self._next_check = now + self.settings.ack_timeout_s
        task = asyncio.get_running_loop().create_task(self._check_node())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _check_node(self) -> None:
        node = self.connected_to
        try:
            await asyncio.wait_for(self._js.account_info(), NODE_CHECK_S)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("NATS node %s does not answer (%s): moving to another", node, type(exc).__name__)
            self._avoid, self._avoid_until = node, time.monotonic() + AVOID_S
            await self._nc.force_reconnect()
        finally:
            self._checking = False

    def _choose_server(self, servers: list[Server]) -> tuple[Server | None, float]:
        """The next server nats-py connects to: one that did not fail its last attempt, avoiding
        the node this connection moved away from while another is left; else the one that failed
        least, after :data:`RECONNECT_WAIT_S`."""
        avoid = self._avoid if time.monotonic() < self._avoid_until else ""
        fresh = [s for s in servers if not s.reconnects and s.uri.netloc != avoid]
        if fresh:
            return fresh[0], 0.0
        return (min(servers, key=lambda s: s.reconnects), RECONNECT_WAIT_S) if servers else (None, 0.0)

    async def stream_bounds(self, stream: str) -> Bounds:
        """The stream's first and last sequence as its leader gives them; the last no lower than any
        this connection had acknowledged on the stream (a reader reads its own writes).

        A replica that knows no leader for the stream (an election, or no quorum) answers its info
        with its own store's state (nats-server's ``jsStreamInfoRequest``), which may be behind what
        the stream acknowledged: such an answer is asked again, as silence is, for :data:`ELECTION_S`.

        Raises:
            LogUnavailable: no answer from a leader within :data:`ELECTION_S`.
        """
        patience = Patience(ELECTION_S, first_s=0.05, max_s=1.0, silent=self._silent)
        while True:
            try:
                info = await self._js.stream_info(stream)
                if info.cluster is None or info.cluster.leader:
                    last = max(info.state.last_seq, self._acks.acked.get(stream, 0))
                    return Bounds(info.state.first_seq, last)
                why = "only a replica that knows no leader answered"
            except UNANSWERED as exc:
                why = f"no answer ({type(exc).__name__})"
            if not await patience.wait():
                raise LogUnavailable(f"the {stream} stream has no leader after {ELECTION_S:.0f} s: {why}")

    async def _on_ack(self, msg: Msg) -> None:
        no_responders = bool(msg.headers) and msg.headers.get("Status") == "503"  # type: ignore[union-attr]
        self._acks.resolve(msg.subject[len(self._inbox) :], msg.data, no_responders)

    async def _publish(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str],
        expected: int | None = None,
    ) -> asyncio.Future[Position]:
        """Send an append (in the next group commit of its stream) and return the future of its
        position."""
        if self._group is not None:
            future = self._group.enqueue(subject, data, headers, expected)
            if future is not None:
                return future
        return await self._publish_now(subject, data, headers, expected)

    async def _publish_now(
        self,
        subject: str,
        data: bytes,
        headers: dict[str, str],
        expected: int | None = None,
    ) -> asyncio.Future[Position]:
        token = str(next(self._tokens))
        future = self._acks.add(token, subject, expected)
        try:
            await self._nc.publish(subject, data, reply=self._inbox + token, headers=headers)
        except nats.errors.Error as exc:
            self._acks.pending.pop(token, None)
            raise LogUnavailable(f"cannot publish to {subject}: {exc}") from None
        return future

    async def _publish_batch(
        self, messages: list[tuple[str, bytes, dict[str, str]]], size: int
    ) -> asyncio.Future[Position]:
        """Send an atomic batch as one write (:func:`core.log.frames.batch_frames`); the future of its
        commit's acknowledgement."""
        nc = self._nc
        if nc.is_closed or (not nc.is_connected and nc._max_pending_size <= 0):
            raise LogUnavailable(f"cannot publish a batch to {messages[-1][0]}: not connected")
        token = str(next(self._tokens))
        future = self._acks.add(token, messages[-1][0], None, batch=size)
        frames = batch_frames(messages, self._inbox + token)
        try:
            await nc._send_command(frames)
            if nc._flush_queue is not None and nc._flush_queue.empty():
                await nc._flush_pending()
        except nats.errors.Error as exc:
            self._acks.pending.pop(token, None)
            self._acks.batches.pop(token, None)
            raise LogUnavailable(f"cannot publish a batch to {messages[-1][0]}: {exc}") from None
        return future

    async def _wait_pending(self) -> None:
        for future, *_ in list(self._acks.pending.values()):
            with contextlib.suppress(Exception):
                await future
