"""A pod, as its JSON comes from the API server, read as the dispatcher reports it. Pure.

A pod's phase and its containers' states say whether a shard started, ended and how (exit code,
reason such as ``OOMKilled`` or ``ImagePullBackOff``), and when (what metering counts from). A field
the kubelet has not reported yet reads as empty, never as an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Json = dict[str, Any]
MAX_TEXT = 256
"""Characters kept of any text a pod's JSON holds (names, reasons, times)."""


@dataclass(frozen=True)
class ContainerState:
    """One container of a pod, as the kubelet reports it.

    Attributes:
        state: ``waiting``, ``running``, ``terminated``, or ``unknown`` when not reported yet.
        reason: why it waits or ended (``ImagePullBackOff``, ``Completed``, ``OOMKilled``...).
        exit_code: the exit code once terminated.
        started_at: RFC 3339 time it started running, or empty.
        finished_at: RFC 3339 time it terminated, or empty.
        restarts: how many times the kubelet restarted it.
        ready: whether its readiness probe passes (``ready: true``; anything else is not ready).
    """

    name: str
    state: Literal["waiting", "running", "terminated", "unknown"]
    reason: str = ""
    exit_code: int | None = None
    started_at: str = ""
    finished_at: str = ""
    restarts: int = 0
    ready: bool = False


@dataclass(frozen=True)
class PodState:
    """One pod: its phase (``Pending``, ``Running``, ``Succeeded``, ``Failed``, ``Unknown``), node,
    start time (RFC 3339, empty before the kubelet took it) and containers."""

    namespace: str
    name: str
    labels: dict[str, str]
    phase: str
    node: str
    started_at: str
    containers: tuple[ContainerState, ...]


def pod_state(item: Json) -> PodState:
    """A pod's JSON as a :class:`PodState`: missing fields read as not reported yet, and values of
    the wrong type as missing (the cluster may be the tenant's); every text is cut to
    :data:`MAX_TEXT` characters."""
    meta, spec, status = (_dict(item.get(k)) for k in ("metadata", "spec", "status"))
    labels = _dict(meta.get("labels"))
    statuses = status.get("containerStatuses")
    return PodState(
        namespace=_text(meta.get("namespace")),
        name=_text(meta.get("name")),
        labels={_text(k): _text(v) for k, v in labels.items()},
        phase=_text(status.get("phase")) or "Pending",
        node=_text(spec.get("nodeName")),
        started_at=_text(status.get("startTime")),
        containers=tuple(_container(_dict(c)) for c in (statuses if isinstance(statuses, list) else [])),
    )


_STATES: tuple[Literal["terminated", "running", "waiting"], ...] = ("terminated", "running", "waiting")


def _dict(value: object) -> Json:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _container(item: Json) -> ContainerState:
    state = _dict(item.get("state"))
    name, restarts = _text(item.get("name")), _int(item.get("restartCount")) or 0
    ready = item.get("ready") is True
    for key in _STATES:
        if isinstance(state.get(key), dict):
            detail = state[key]
            return ContainerState(
                name=name,
                state=key,
                reason=_text(detail.get("reason")),
                exit_code=_int(detail.get("exitCode")),
                started_at=_text(detail.get("startedAt")),
                finished_at=_text(detail.get("finishedAt")),
                restarts=restarts,
                ready=ready,
            )
    return ContainerState(name=name, state="unknown", restarts=restarts, ready=ready)
