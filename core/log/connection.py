"""The log's connection to NATS: connecting with the deployment's credentials, the reply inbox that
JetStream acknowledges appends on, and closing without dropping an append in flight."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any, Self

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from core.errors import LogUnavailable
from core.settings import Settings
from core.wire import AckTracker, Position, RawTap

CONNECT_TIMEOUT_S = 5.0


class LogConnection:
    """One NATS connection, its JetStream context and its acknowledgement inbox: what every part of
    :class:`core.log.EventLog` shares.

    Appends are published with a reply subject on the log's own inbox and matched to their
    acknowledgements by :class:`core.wire.AckTracker` (see :mod:`core.wire` for why not nats-py's
    ``publish_async``).
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
        self._raw_tap: RawTap | None = None

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
            "reconnect_time_wait": 0.5,
            "allow_reconnect": True,
        }
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
        log = cls(nc, settings)
        log._inbox = nc.new_inbox() + "."
        await nc.subscribe(log._inbox + "*", cb=log._on_ack)
        return log

    async def close(self) -> None:
        """Wait for outstanding appends (up to the ack time-out), then disconnect."""
        with contextlib.suppress(Exception):
            await self._wait_pending()
        for task in list(self._background):
            with contextlib.suppress(Exception):
                await task
        self._acks.close()
        self._acks.fail_all(LogUnavailable("event log closed"))
        with contextlib.suppress(Exception):
            await self._nc.drain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
        token = str(next(self._tokens))
        future = self._acks.add(token, subject, expected)
        try:
            await self._nc.publish(subject, data, reply=self._inbox + token, headers=headers)
        except nats.errors.Error as exc:
            self._acks.pending.pop(token, None)
            raise LogUnavailable(f"cannot publish to {subject}: {exc}") from None
        return future

    async def _wait_pending(self) -> None:
        for future, *_ in list(self._acks.pending.values()):
            with contextlib.suppress(Exception):
                await future
