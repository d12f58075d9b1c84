"""The coordinator: the service that places work, detects lost workers and recovers their work.

* :mod:`ops.coordinator.service`: the loop: it reads the projections, calls the pure decisions
  (:mod:`core.placement`, :mod:`projections.admission`, :mod:`projections.lifecycle`,
  :mod:`projections.recovery`, :mod:`projections.gangs`, :mod:`projections.replica_upkeep`) and
  appends what they return;
* its halves, glue too: :mod:`ops.coordinator.job_queue` (admits, places and preempts for queued
  jobs), :mod:`ops.coordinator.starts` (start commands), :mod:`ops.coordinator.replicas` (endpoint
  replicas), their appends kept in flight by :mod:`ops.coordinator.pipeline`; each is built from
  what it uses (:mod:`ops.coordinator.appender`, which counts conflicts; read-only views of the
  projections and a clock, :mod:`ops.coordinator.views`; the presigner), never from the coordinator;
* its bookkeeping, so that a step costs what changed: :mod:`ops.coordinator.live_capacity` (the fleet's
  free capacity), :mod:`ops.coordinator.beat_deadlines` (a heap of heartbeat deadlines);
* what it sends agents: :mod:`ops.coordinator.workspecs` (a shard's spec by job kind),
  :mod:`ops.coordinator.inputs` (presigned inputs).
"""

from ops.coordinator.service import Coordinator, running, serve
from ops.coordinator.starts import start_command

__all__ = ["Coordinator", "running", "serve", "start_command"]
