"""The base every stored event derives from, and the rules that keep old events readable.

An event is a frozen, keyword-only msgspec Struct whose tag is written by hand, never derived from a
class path: ``class JobSubmitted(Event, tag="job.submitted")``. The tag names the stream family
(``job``), the event (``submitted``) and, from the second version on, its version
(``job.submitted@2``). The identity of the thing an event is about (tenant, job, worker) and its
order live in the envelope (subject, stream sequence, message id), not in the payload.

Schema evolution (see ``docs/schema-evolution`` in msgspec):

* additive change: a new field with a default; old events decode, old readers ignore the new field
  (stored events tolerate unknown fields);
* breaking change: a new class with tag ``<name>@<n+1>`` plus an upcaster registered with
  :func:`upcaster` that turns the old shape into the new one. Old events stay in the log forever and
  always decode; readers only ever see the newest version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

TAG_FIELD = "type"


_TAGS: dict[type, str] = {}


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field=TAG_FIELD):
    """Base of every event, command and stored record on a stream.

    msgspec applies ``kw_only`` to the fields a class itself defines, so every subclass repeats
    ``kw_only=True`` (a test checks that none forgets), and ``frozen=True`` so that type checkers
    see what msgspec already enforces.
    """

    @classmethod
    def event_tag(cls) -> str:
        """The stable tag that identifies this event type on the wire."""
        # msgspec builds a new config object at every ``__struct_config__``: ~5 us, on every append
        tag = _TAGS.get(cls)
        if tag is None:
            tag = _TAGS[cls] = str(cls.__struct_config__.tag)
        return tag

    @classmethod
    def event_family(cls) -> str:
        """The stream family of this event: ``job`` for ``job.submitted``."""
        return cls.event_tag().split(".", 1)[0]

    @classmethod
    def event_name(cls) -> str:
        """The event's name without family or version: ``submitted`` for ``job.submitted@2``.

        This is the last token of the event's subject on streams whose subjects end in the event name.
        """
        return cls.event_tag().split(".", 1)[1].split("@", 1)[0]

    @classmethod
    def event_version(cls) -> int:
        """1 for ``job.submitted``, n for ``job.submitted@n``."""
        _, _, version = cls.event_tag().partition("@")
        return int(version) if version else 1


class Value(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen value object nested inside events (no tag of its own)."""


class Fields(msgspec.Struct, frozen=True, kw_only=True):
    """A group of fields that several events (or values) carry with one meaning, defined once.

    A struct takes one group by deriving from it after its own base
    (``class JobStarted(Event, AssignmentRef, tag="job.started")``); a group may extend another.
    Nothing is nested: the group's fields come first on the wire, in the group's order, then the
    struct's own; a struct may give a field of the group another default, and the field keeps its
    place. A group has no tag and is never stored by itself.
    """


E = TypeVar("E", bound=Event)
Upcaster = Callable[[Any], Event]

UPCASTERS: dict[type[Event], Upcaster] = {}
"""Old event version -> its upcaster. Read it; register with :func:`upcaster`."""


def upcaster(old: type[E]) -> Callable[[Callable[[E], Event]], Callable[[E], Event]]:
    """Register a pure function that turns an old event version into the next one.

    Example::

        @upcaster(JobSubmittedV1)
        def _(old: JobSubmittedV1) -> JobSubmitted:
            return JobSubmitted(name=old.name, shards=1, ...)
    """

    def register(fn: Callable[[E], Event]) -> Callable[[E], Event]:
        if old in UPCASTERS:
            raise ValueError(f"an upcaster for {old.event_tag()} is already registered")
        UPCASTERS[old] = fn
        return fn

    return register


def upcast(event: Event) -> Event:
    """Apply registered upcasters until the event is at its newest version."""
    while (fn := UPCASTERS.get(type(event))) is not None:
        event = fn(event)
    return event


def is_superseded(cls: type[Event]) -> bool:
    """True for an old event version that readers never see (it has an upcaster)."""
    return cls in UPCASTERS
