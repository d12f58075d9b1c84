"""The event catalog: every event type, grouped by the stream family it is stored in.

Each family has one tagged union and one module-level typed decoder. :func:`decode` is what readers
call: it decodes with the family's decoder and upcasts old versions, so reducers only ever see the
newest shape of each event.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, get_args

import msgspec

from schemas._base import Event, Fields, is_superseded, upcast
from schemas.audit import AuditEvent
from schemas.commands import CommandEvent
from schemas.endpoints import EndpointEvent
from schemas.federation import FederationEvent
from schemas.jobs import JobEvent
from schemas.metering import MeteringEvent
from schemas.providers import ProviderEvent
from schemas.tenants import TenantEvent
from schemas.workers import HeartbeatEvent, WorkerEvent

FAMILIES: dict[str, Any] = {
    "job": JobEvent,
    "endpoint": EndpointEvent,
    "worker": WorkerEvent,
    "hb": HeartbeatEvent,
    "meter": MeteringEvent,
    "cmd": CommandEvent,
    "tenant": TenantEvent,
    "provider": ProviderEvent,
    "api": AuditEvent,
    "federation": FederationEvent,
}
"""Family (the first subject token, and the first part of every tag) -> its tagged union."""


def _members(union: Any) -> tuple[type[Event], ...]:
    return get_args(union) or (union,)


EVENT_TYPES: tuple[type[Event], ...] = tuple(cls for u in FAMILIES.values() for cls in _members(u))
BY_TAG: dict[str, type[Event]] = {cls.event_tag(): cls for cls in EVENT_TYPES}

_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    family: msgspec.json.Decoder(union) for family, union in FAMILIES.items()
}
_ENCODER = msgspec.json.Encoder()

assert len(BY_TAG) == len(EVENT_TYPES), "duplicate event tag"
assert all(cls.event_family() in FAMILIES for cls in EVENT_TYPES), "event tag outside its family"


class UnknownFamily(ValueError):
    """A subject whose first token names no event family."""


def decoder(family: str) -> msgspec.json.Decoder[Any]:
    """The typed decoder of one family's tagged union."""
    try:
        return _DECODERS[family]
    except KeyError:
        raise UnknownFamily(f"no event family {family!r}") from None


def decode(family: str, data: bytes) -> Event:
    """Decode one stored event of ``family`` and upcast it to its newest version.

    Raises:
        msgspec.ValidationError / msgspec.DecodeError: the bytes are not a valid event of the family.
        UnknownFamily: ``family`` is not in the catalog.
    """
    event: Event = decoder(family).decode(data)
    return upcast(event)


def encode(event: Event) -> bytes:
    """The canonical JSON of an event (its tag in the ``type`` field)."""
    return _ENCODER.encode(event)


def current_types() -> tuple[type[Event], ...]:
    """Every event type readers can see (old versions that are upcast away excluded)."""
    return tuple(cls for cls in EVENT_TYPES if not is_superseded(cls))


def json_schemas() -> dict[str, dict[str, Any]]:
    """A standalone JSON Schema (2020-12) per event tag, for subscribers outside Python."""
    out: dict[str, dict[str, Any]] = {}
    for cls in EVENT_TYPES:
        (ref,), components = msgspec.json.schema_components([cls], ref_template="#/$defs/{name}")
        out[cls.event_tag()] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://resontech.dev/schemas/{cls.event_tag()}.json",
            "title": cls.event_tag(),
            "description": _description(cls),
            **ref,
            "$defs": components,
        }
    return out


def _description(cls: type[Event]) -> str:
    """The event's docstring, then those of the field groups it carries (their fields are its own)."""
    groups = [c for c in cls.__mro__[1:] if issubclass(c, Fields) and c is not Fields]
    return "\n\n".join(inspect.cleandoc(c.__doc__) for c in (cls, *groups) if c.__doc__)


def export_json_schemas(directory: Path) -> list[Path]:
    """Write one ``<tag>.schema.json`` per event (plus ``index.json``) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    index = {}
    for tag, schema in sorted(json_schemas().items()):
        path = directory / f"{tag}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
        index[tag] = {"family": tag.split(".", 1)[0], "file": path.name}
    (directory / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return written
