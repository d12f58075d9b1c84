"""Projection records for pure unit tests, built from one flat set of fields.

A record carries its submission whole (``JobRecord.spec``, ``EndpointRecord.spec``); a test names
the fields it cares about side by side, and these put each where it belongs.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from projections.endpoints import EndpointRecord
from projections.schedule import JobRecord
from schemas import EndpointDeployed, JobSubmitted

R = TypeVar("R", JobRecord, EndpointRecord)


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


def changed(record: R, **changes: Any) -> R:
    """``record`` with ``changes``, each made to its spec or to the record, wherever it belongs."""
    spec = _spec_fields(type(record.spec), changes)
    return msgspec.structs.replace(record, spec=msgspec.structs.replace(record.spec, **spec), **changes)
