"""Projection records for pure unit tests, built from one flat set of fields.

A record carries its submission whole (``JobRecord.spec``, ``EndpointRecord.spec``,
``WorkerRecord.registration``); a test names the fields it cares about side by side, and these put
each where it belongs.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from projections.endpoints import EndpointRecord
from projections.registry import WorkerRecord
from projections.schedule import JobRecord
from schemas.endpoints import EndpointDeployed
from schemas.jobs import JobSubmitted
from schemas.workers import WorkerRegistered

R = TypeVar("R", JobRecord, EndpointRecord, WorkerRecord)


def _spec_fields(spec_type: type[msgspec.Struct], fields: dict[str, Any]) -> dict[str, Any]:
    return {name: fields.pop(name) for name in list(fields) if name in spec_type.__struct_fields__}


def job_record(**fields: Any) -> JobRecord:
    """A job record; fields of :class:`JobSubmitted` go into its ``spec`` (``name`` defaults to the
    job id, ``kind`` to ``process``, ``shards`` to 1)."""
    spec = _spec_fields(JobSubmitted, fields)
    spec.setdefault("name", fields.get("job_id", "job"))
    spec.setdefault("kind", "process")
    spec.setdefault("shards", 1)
    return JobRecord(spec=JobSubmitted(**spec), **fields)


def endpoint_record(**fields: Any) -> EndpointRecord:
    """An endpoint record; fields of :class:`EndpointDeployed` go into its ``spec`` (``name``
    defaults to the endpoint id, ``model`` to ``m``)."""
    spec = _spec_fields(EndpointDeployed, fields)
    spec.setdefault("name", fields.get("endpoint_id", "endpoint"))
    spec.setdefault("model", "m")
    return EndpointRecord(spec=EndpointDeployed(**spec), **fields)


def worker_record(**fields: Any) -> WorkerRecord:
    """A worker record; fields of :class:`WorkerRegistered` go into its ``registration``
    (``provider`` defaults to ``p``, ``hostname`` to the worker id)."""
    registration = _spec_fields(WorkerRegistered, fields)
    registration.setdefault("provider", "p")
    registration.setdefault("hostname", fields.get("worker_id", "host"))
    return WorkerRecord(registration=WorkerRegistered(**registration), **fields)


def changed(record: R, **changes: Any) -> R:
    """``record`` with ``changes``, each made to its spec (registration) or to the record, wherever
    it belongs."""
    whole = "registration" if isinstance(record, WorkerRecord) else "spec"
    inner = getattr(record, whole)
    fields = _spec_fields(type(inner), changes)
    return msgspec.structs.replace(record, **{whole: msgspec.structs.replace(inner, **fields)}, **changes)
