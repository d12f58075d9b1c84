"""The event log: the one package that appends to and reads from NATS JetStream.

Everything that happens is an event appended here; everything that is known is folded from what
this package reads back. It owns the wire details: the ``Nats-Msg-Id`` that makes a retried append
idempotent, the expected-sequence headers that turn a lost race into
:class:`~core.errors.ConcurrencyConflict`, acknowledgement time-outs, ordered replay, and the
quarantine of stored bytes that no longer decode. The vocabulary its callers share (header names,
:class:`~core.wire.Position`, event ids) lives in :mod:`core.wire`, which imports no nats-py.

:class:`EventLog` (:mod:`core.log.event_log`) is the one entry point: every public method of the
log is defined on it, and each delegates to the module that holds its machinery. It is a
:class:`~core.log.connection.LogConnection`, its one base class; the other modules are not mixins
but plain functions and small classes, each given what it uses (the JetStream context, the publish
path, the node check) by :class:`EventLog`. The modules, by role:

* :mod:`core.log.event_log`: :class:`EventLog`, the public methods;
* :mod:`core.log.connection`: connecting, the reply inbox appends are acknowledged on, the publish
  path, a stream's bounds, moving away from a silent node, closing;
* :mod:`core.log.acks`: acknowledgements settled on futures (:class:`~core.log.acks.AckTracker`,
  instead of nats-py's ``publish_async``);
* :mod:`core.log.group_commit`: appends to one stream that wait together sent as one atomic batch;
* :mod:`core.log.frames`: protocol frames built and cut directly: atomic batches, delivery reply
  subjects, and the raw tap the scan reads through;
* :mod:`core.log.appending`: an append's headers and subject check, and its retries while nothing
  answers; many appends in flight, in order. Every append not acknowledged within
  ``ack_timeout_s`` fails with :class:`~core.errors.AppendTimeout`;
* :mod:`core.log.scan`: the raw, ordered scan that projections rebuild with
  (:class:`~core.log.scan.Scanner`, which keeps the connection's raw tap);
* :mod:`core.log.reading`: decoded reads: the last event on a subject, replay, watch;
* :mod:`core.log.decoding`: stored bytes to events, and QUARANTINE (written with its reasons by
  :meth:`EventLog.quarantine_now`, read with them by :meth:`EventLog.quarantined`);
* :mod:`core.log.queues`: the work queues: agents' claims on INTAKE (:meth:`EventLog.pull`) and
  each worker's commands (:meth:`EventLog.commands`);
* :mod:`core.log.streams`: creating and updating the streams of :mod:`core.streams`;
* :mod:`core.log.snapshots`: projection snapshots in JetStream's object store.
"""

from core.log.appending import NO_RESPONDERS_RETRY_S
from core.log.event_log import EventLog
from core.log.queues import Pulled
from core.log.reading import Watch
from core.wire import Position, Quarantined, RawRecord, new_event_id

__all__ = [
    "NO_RESPONDERS_RETRY_S",
    "EventLog",
    "Position",
    "Pulled",
    "Quarantined",
    "RawRecord",
    "Watch",
    "new_event_id",
]
