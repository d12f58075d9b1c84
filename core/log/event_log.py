"""The event log's one class, with every role it plays: appends, reads, work queues, the streams
and snapshots."""

from __future__ import annotations

from core.log.appending import Appending
from core.log.queues import WorkQueues
from core.log.reading import Reading
from core.log.snapshots import Snapshots
from core.log.streams import StreamSetup


class EventLog(Appending, Reading, WorkQueues, StreamSetup, Snapshots):
    """A connection to the event log.

    Create with :meth:`connect`; call :meth:`ensure_streams` once at start-up of anything that owns
    the deployment (the dev stack, tests, ``resontech streams``).
    """
