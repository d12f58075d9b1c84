"""The clients of a partition case (:mod:`tests.lab.partition_cases`): the writer on the majority side,
the client that can only reach the node cut off, and a roaming client given every URL that starts
on the node cut off.

Both write through the kernel's own :class:`~core.log.EventLog`, ``JobProgress`` events with unique
event ids (``Nats-Msg-Id``), as the durability test does.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

from core.errors import ResontechError
from core.log import EventLog
from core.settings import Settings
from core.streams import job_subject
from schemas.jobs import JobProgress

WRITER_ACK_TIMEOUT_S = 2.0
MINORITY_ACK_TIMEOUT_S = 2.0
CONTROL_DEADLINE_S = 30.0
RETRY_PAUSE_S = 0.05
"""A writer's pause before it tries an append again (a refusal comes back at once)."""


@dataclass
class Writer:
    """Appends one event after another; a failed append is retried with the same id until acknowledged.

    Attributes:
        log: its connection (given every node's URL).
        prefix: event ids are ``<prefix>-<n>``.
        acks: ``(monotonic time, event id, sequence)`` of every acknowledgement, in order.
        failures: failed attempts by error code (``append_timeout``...).
        failure_messages: the first message of each error code.
    """

    log: EventLog
    prefix: str
    acks: list[tuple[float, str, int]] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    failure_messages: dict[str, str] = field(default_factory=dict)

    @classmethod
    async def connect(cls, url: str, prefix: str, host: str, *, on_it: bool = False) -> Writer:
        """A writer given every URL in ``url`` whose connection landed on a server other than
        ``host`` (the majority's writer) or, ``on_it``, on ``host`` (the roaming client: it has to
        notice that its server answers nothing and move).

        Raises:
            RuntimeError: it kept landing where it should not.
        """
        settings = Settings(nats_url=url, stream_replicas=3, ack_timeout_s=WRITER_ACK_TIMEOUT_S)
        name = "lab-roamer" if on_it else "lab-writer"
        for _ in range(50):  # nats-py picks a server at random
            log = await EventLog.connect(settings, name=name)
            if (_connected_host(log) == host) == on_it:
                return cls(log, prefix)
            await log.close()
        raise RuntimeError(f"the {name} kept {'missing' if on_it else 'connecting to'} {host}")

    @property
    def connected_to(self) -> str:
        """``host:port`` of the server its connection is on."""
        return self.log.connected_to

    async def run(self, stop: asyncio.Event) -> None:
        """Append until ``stop`` is set (an append in progress then gets no further retry)."""
        for step in itertools.count():
            if stop.is_set():
                return
            event_id = f"{self.prefix}-{step}"
            subject = job_subject("acme", f"j{step % 13}", JobProgress)
            while not stop.is_set():
                try:
                    position = await self.log.append(
                        subject, JobProgress(epoch=1, step=step), event_id=event_id
                    )
                except ResontechError as exc:
                    self.failures[exc.code] += 1
                    self.failure_messages.setdefault(exc.code, exc.message[:300])
                    await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                self.acks.append((time.monotonic(), event_id, position.seq))
                break

    def acked_between(self, start: float, end: float = float("inf")) -> int:
        """How many acknowledgements came in ``[start, end)`` (monotonic times)."""
        return sum(1 for t, _, _ in self.acks if start <= t < end)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without an acknowledgement between ``start`` and ``end``, in seconds."""
        times = [start, *(t for t, _, _ in self.acks if start <= t <= end), end]
        return max(b - a for a, b in itertools.pairwise(times))


@dataclass
class MinorityClient:
    """Appends one event after another through one server alone, each tried once.

    Attributes:
        log: its connection (given that server's URL only).
        prefix: event ids are ``<prefix>-<n>``.
        attempted: every event id tried, in order.
        acked: ``(event id, sequence)`` of every acknowledged append.
        outcomes: what each attempt ended in (``acked`` or an error code).
    """

    log: EventLog
    prefix: str
    attempted: list[str] = field(default_factory=list)
    acked: list[tuple[str, int]] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)

    @classmethod
    async def connect(cls, url: str, prefix: str) -> MinorityClient:
        """A client of the one server at ``url``."""
        settings = Settings(nats_url=url, ack_timeout_s=MINORITY_ACK_TIMEOUT_S)
        return cls(await EventLog.connect(settings, name="lab-minority"), prefix)

    async def append_once(self) -> bool:
        """One append; whether it was acknowledged."""
        event_id = f"{self.prefix}-{len(self.attempted)}"
        self.attempted.append(event_id)
        subject = job_subject("acme", "minority", JobProgress)
        event = JobProgress(epoch=2, step=len(self.attempted))
        try:
            position = await self.log.append(subject, event, event_id=event_id)
        except ResontechError as exc:
            self.outcomes[exc.code] += 1
            return False
        self.outcomes["acked"] += 1
        self.acked.append((event_id, position.seq))
        return True

    async def control(self) -> None:
        """Prove the client works before the cut: one append acknowledged (retried while the
        cluster settles after the case before).

        Raises:
            RuntimeError: none was acknowledged within 30 s.
        """
        deadline = time.monotonic() + CONTROL_DEADLINE_S
        while not await self.append_once():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the minority client's control append failed: {dict(self.outcomes)}")

    async def run(self, stop: asyncio.Event) -> None:
        """Append until ``stop`` is set."""
        while not stop.is_set():
            await self.append_once()

    @property
    def connected_to(self) -> str:
        """``host:port`` of the server its connection is on."""
        return self.log.connected_to


def _connected_host(log: EventLog) -> str:
    return log.connected_to.rsplit(":", 1)[0]
