"""Whether a silence is the workers' or the log's, before a worker is declared lost.

The coordinator declares a worker lost when its heartbeats stop reaching it. On a cluster they also
stop when the log cannot store or deliver them: while the HEARTBEATS stream elects a new leader
(4-9 s after its node died, and in every rolling restart), or while the coordinator's own consumer
recovers from the loss of the node that served it. Declaring the fleet lost then would revoke and
restart work that never stopped. So before it declares anyone, the coordinator asks the stream for
its newest heartbeat (:class:`SilenceJudge`):

* the stream does not answer: the log is down, not the workers: nobody is declared;
* it holds beats newer than any this coordinator received: the delivery is behind: nobody is
  declared;
* either happened lately: nobody is declared until the workers have had their whole allowance to
  beat again (:data:`core.clock.LOST_AFTER_INTERVALS` of their interval) after the log came back;
* otherwise the silence is the workers' own.

A lone worker that dies is still detected: the stream answers and holds nothing newer. What is
postponed is judged again at the next step.
"""

from __future__ import annotations

import asyncio
import logging

from core.clock import lost_after_s, seconds_ns
from core.errors import ResontechError
from core.log import EventLog

log = logging.getLogger("resontech.coordinator")

READ_S = 2.0
"""How long the stream may take to name its newest heartbeat before it counts as not answering."""
BEHIND_NS = 2_000_000_000
"""A stream newest beat this much newer than the newest one received: the delivery is behind."""


class SilenceJudge:
    """Tells a worker's silence from the log's (see the module docstring).

    Attributes:
        newest_ns: store time of the newest heartbeat the coordinator received.
        postponed: silent workers not declared yet because the log was to blame.
    """

    def __init__(self, event_log: EventLog) -> None:
        self.log = event_log
        self.newest_ns = 0
        self.postponed: set[str] = set()
        self._judge_from_ns = 0

    def beat(self, time_ns: int) -> None:
        """A heartbeat stored at ``time_ns`` was received."""
        if time_ns > self.newest_ns:
            self.newest_ns = time_ns

    async def workers_to_blame(self, now_ns: int, silent: set[str], interval_s: float) -> bool:
        """Whether the silence of ``silent`` (the longest heartbeat interval among them
        ``interval_s``) is theirs: ``False`` postpones them."""
        try:
            newest = await asyncio.wait_for(self.log.get_last("HEARTBEATS", "hb.>"), READ_S)
        except (ResontechError, TimeoutError) as exc:
            return self._postpone(now_ns, silent, interval_s, f"the heartbeat stream does not answer ({exc})")
        if newest is not None and newest.time_ns > self.newest_ns + BEHIND_NS:
            behind_s = (newest.time_ns - self.newest_ns) / 1e9
            return self._postpone(now_ns, silent, interval_s, f"heartbeats reach us {behind_s:.1f}s late")
        if now_ns < self._judge_from_ns:
            self.postponed |= silent
            return False
        self.postponed -= silent
        return True

    def _postpone(self, now_ns: int, silent: set[str], interval_s: float, why: str) -> bool:
        allowance_ns = seconds_ns(lost_after_s(interval_s))  # bounded: never an overflow
        self._judge_from_ns = max(self._judge_from_ns, now_ns + allowance_ns)
        if not self.postponed >= silent:
            log.warning("%d silent workers not declared lost: %s", len(silent), why)
        self.postponed |= silent
        return False
