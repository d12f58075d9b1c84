"""The autoscaler: thin glue between the inference proxy's traffic and :func:`core.autoscale.decide`.

It runs in the gateway because the gateway is where the load is seen: every :data:`TICK_S` it reads
each endpoint's requests per second (the proxy's window), the mean depth of its line (sampled every
tick, over :data:`QUEUE_WINDOW_S`), the requests its replicas hold, how many replicas serve, the
utilisation of their workers' GPUs (the latest heartbeats, where NVML reports it, of the GPUs each
worker registered: a provider's word, which :func:`core.autoscale.decide` acts on only beside the
load measured here) and how long it has been idle, asks the pure decision, and appends ``endpoint.scaled`` (or
``endpoint.scaled_to_zero``) with the inputs it saw, at the endpoint's expected sequence (a
conflict: decided again next tick). The coordinator does
the rest (:mod:`ops.coordinator.replicas`: places, or stops, replicas). A request at zero replicas calls
:func:`wake`, which appends the scale-up the request then waits for.

With several gateways each sees its share of the traffic; the expected sequence keeps their
decisions from overwriting each other, and each scales on what it sees (a known approximation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from core import autoscale
from core.errors import ConcurrencyConflict, ResontechError
from core.streams import endpoint_filter, endpoint_subject
from gateway.inference import InferenceProxy
from gateway.kernel import Kernel
from projections import ENDPOINTS, LIVENESS, REGISTRY
from projections.endpoints import EndpointRecord, ready_replicas
from projections.liveness import LivenessState, registered_readings, util_reading
from projections.registry import RegistryState
from schemas.endpoints import EndpointScaled, EndpointScaledToZero

log = logging.getLogger("resontech.gateway")
TICK_S = 1.0
RPS_WINDOW_S = 10.0
"""The load the decisions see: requests per second over the last 10 s (a load step shows within
seconds; the API's 60 s figures would take a minute to cross a target)."""
QUEUE_WINDOW_S = 5.0
"""The line's depth the decisions see: its mean over the last 5 s (a waiting line that lasts)."""


async def append_scale(kernel: Kernel, endpoint: EndpointRecord, scale: autoscale.Scale) -> bool:
    """Append the decision at the endpoint's expected sequence; whether it was stored."""
    event: Any
    if scale.replicas == 0:
        event = EndpointScaledToZero(idle_s=scale.inputs.get("idle_s", 0.0))
    else:
        event = EndpointScaled(replicas=scale.replicas, reason=scale.reason, inputs=scale.inputs)
    try:
        await kernel.append(
            endpoint_subject(endpoint.tenant, endpoint.endpoint_id, event),
            event,
            expected_seq=endpoint.last_seq,
            expected_filter=endpoint_filter(endpoint.tenant, endpoint.endpoint_id),
        )
    except ConcurrencyConflict:
        return False
    log.info("endpoint %s: %d replica(s): %s", endpoint.endpoint_id, scale.replicas, scale.reason)
    return True


async def wake(kernel: Kernel, endpoint: EndpointRecord) -> None:
    """Scale an endpoint at zero up for a request (a conflict means someone else just did); a failed
    endpoint stays down (only its tenant brings it back)."""
    if endpoint.desired_replicas == 0 and endpoint.spec.max_replicas > 0 and not endpoint.failed:
        await append_scale(kernel, endpoint, autoscale.wake(endpoint.spec))


class Autoscaler:
    """Decides every :data:`TICK_S` about every endpoint (see the module docstring)."""

    def __init__(self, kernel: Kernel, proxy: InferenceProxy) -> None:
        self.kernel = kernel
        self.proxy = proxy
        self.active_since: dict[str, float] = {}  # endpoint key -> when this process saw it serving

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK_S)
            try:
                await self.tick(time.monotonic())
            except ResontechError as exc:
                log.warning("autoscaler tick failed: %s", exc.message)

    def idle_s(self, key: str, endpoint: EndpointRecord, now: float) -> float:
        """Seconds since the endpoint's last request, or since it last started serving: a replica
        still starting (a cold start can take minutes) never counts as idle time, nor does a request
        held or waiting (a long generation is not idleness)."""
        if endpoint.state != "serving":
            self.active_since.pop(key, None)
            return 0.0
        line = self.proxy.lines.get(key)
        if line is not None and (line.held or line.depth):
            self.active_since[key] = now  # busy now: idle time starts again from here
            return 0.0
        since = self.active_since.setdefault(key, now)
        traffic = self.proxy.traffic.get(key)
        last = traffic.last_request_at if traffic is not None else 0.0
        return now - max(since, last)

    async def tick(self, now: float) -> None:
        beats = Readings(self.kernel.state(LIVENESS), self.kernel.state(REGISTRY))
        for key, endpoint in list(self.kernel.state(ENDPOINTS).endpoints.items()):
            if endpoint.state in ("deleted", "failed"):
                continue
            idle = self.idle_s(key, endpoint, now)
            rps = self.proxy.figures(key, RPS_WINDOW_S).rps if key in self.proxy.traffic else 0.0
            scale = autoscale.decide(
                endpoint.spec, endpoint.desired_replicas, rps, idle, self.load(key, endpoint, beats, now)
            )
            if scale is not None:
                await append_scale(self.kernel, endpoint, scale)

    def load(self, key: str, endpoint: EndpointRecord, beats: Readings, now: float) -> autoscale.Load:
        """The endpoint's line (sampled now) and replicas, as the decision reads them."""
        line = self.proxy.lines.get(key)
        if line is not None:
            line.sample(now)
            self.proxy.sample_line(key)  # the hour's peak depths, while a line drains too
        serving = ready_replicas(endpoint)
        return autoscale.Load(
            queued=line.mean_depth(now, QUEUE_WINDOW_S) if line is not None else 0.0,
            in_flight=line.held if line is not None else 0,
            ready=len(serving),
            gpu_util_pct=gpu_util(beats, {r.worker_id for r in serving}),
        )


@dataclass(frozen=True, slots=True)
class Readings:
    """The latest beats, and the registry that says which GPUs each worker has (``None``: every
    reading counts, for a caller without a registry)."""

    liveness: LivenessState
    registry: RegistryState | None = None


def gpu_util(beats: LivenessState | Readings, workers: set[str]) -> float | None:
    """Mean utilisation of the GPUs of ``workers`` in their latest heartbeats; ``None`` when none
    reports one (CPU hosts, no NVML). A worker's GPUs are all counted: a replica shares its host's.
    With a registry, only readings of GPUs the worker registered count
    (:func:`projections.liveness.registered_readings`): a CPU host's "100% busy" is no reading."""
    readings = beats if isinstance(beats, Readings) else Readings(beats)
    utils = []
    for w in sorted(workers):
        beat = readings.liveness.beats.get(w)
        if beat is None:
            continue
        gpus = beat.gpus
        if readings.registry is not None:
            record = readings.registry.workers.get(w)
            gpus = registered_readings(gpus, record.registration.gpus if record is not None else [])
        utils += [util for g in gpus if (util := util_reading(g)) is not None]
    return sum(utils) / len(utils) if utils else None
