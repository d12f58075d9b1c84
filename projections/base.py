"""What a projection is: a name, the stream it folds, an initial state and a pure ``evolve``.

``evolve(state, recorded) -> state`` is pure: no I/O, no clock, no randomness, no globals; time
comes from the event or its envelope. For speed over millions of events a reducer may update the
container it is given (dicts inside the state) and return it, so a caller that needs an older state
keeps its own copy (:func:`copy_state`); the records stored inside a state are frozen and replaced,
never mutated. Folding the same events gives the same state and the same :func:`state_hash`, on any
machine, on any day.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from schemas.envelope import Recorded

S = TypeVar("S", bound=msgspec.Struct)

_ENCODER = msgspec.json.Encoder(order="sorted")


@dataclass(frozen=True, slots=True)
class Projection(Generic[S]):
    """A pure fold of one stream into a state.

    Attributes:
        name: stable name, used for snapshots and reports (``registry``).
        stream: the stream it folds (``WORKERS``).
        version: bump when ``evolve`` changes meaning; snapshots of another version are discarded
            and the projection is rebuilt from the log.
        state_type: the msgspec Struct type of the state (snapshots decode into it); called with no
            arguments it gives the empty state (:meth:`initial`).
        evolve: the reducer.
        subjects: an optional subject filter inside the stream.
        admit: an optional budget, ``admit(state, subject, seq, time_ns) -> bool``, asked of every
            stored message before it is decoded: a message it refuses is never decoded (nor
            quarantined) and never reaches ``evolve``. It may record what it admitted in the state
            (it is part of the fold: :meth:`fold` and every runner ask it the same way), so that one
            sender's flood costs the fold a dictionary lookup per message (:mod:`projections.liveness`).
    """

    name: str
    stream: str
    version: int
    state_type: type[S]
    evolve: Callable[[S, Recorded[Any]], S]
    subjects: str | None = None
    admit: Callable[[S, str, int, int], bool] | None = None

    def initial(self) -> S:
        """The empty state: the state type with every field at its default."""
        return self.state_type()

    def fold(self, records: Iterable[Recorded[Any]], state: S | None = None) -> S:
        """Apply ``records`` in order to ``state`` (default: a new initial state), each one the
        projection's :attr:`admit` admits."""
        current = self.initial() if state is None else state
        evolve, admit = self.evolve, self.admit
        for record in records:
            if admit is None or admit(current, record.subject, record.seq, record.time_ns):
                current = evolve(current, record)
        return current


def canonical_json(state: msgspec.Struct) -> bytes:
    """The state as JSON with sorted keys: the bytes the hash is computed over."""
    return _ENCODER.encode(state)


def state_hash(state: msgspec.Struct) -> str:
    """A stable SHA-256 of the state, independent of dict insertion order."""
    return hashlib.sha256(canonical_json(state)).hexdigest()


def copy_state(projection: Projection[S], state: S) -> S:
    """A deep copy of ``state`` (through its canonical encoding)."""
    return msgspec.json.decode(canonical_json(state), type=projection.state_type)
