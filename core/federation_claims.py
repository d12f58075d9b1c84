"""Who runs each federated job's FL server: the claims of federation service instances, folded from
the FEDERATION stream, and the pure decisions on them.

Several instances of the federation service may run (on several hosts, for availability); each
federated job's FL server must run in exactly one of them. The rule:

* an instance *claims* a job (``federation.claimed``, term = the last term + 1) when nobody holds it,
  or when its holder has *lapsed*: this observer has seen no new event of the holder's incarnation
  for the holder's lease (measured on the observer's own clock, from when it first saw the holder's
  latest event);
* an instance *renews* everything it holds with one ``federation.beat`` every ``lease / 5``;
* every append to the stream (beat, claim, provisioned, released) is made against the stream's last
  sequence as the writer has folded it (one compare-and-set over ``federation.>``). A writer whose
  view is stale gets a conflict, reads on and decides again: no instance can claim, renew or provision
  without having seen every claim before its own;
* an instance may run a job's FL server only while it holds the job *and* less than
  ``lease * FENCE_FRACTION`` has passed since it sent its latest acknowledged append (its renewal):
  see :func:`serving_until`. A holder that cannot renew (partitioned, paused, starved) stops serving
  before anyone may take over: its latest renewal was sent before the taker first saw it, and the
  taker waits a whole lease from then.

Why renewals cannot race a takeover: a takeover is appended against a view in which the holder's
latest event is one it saw a lease ago; any later event of the holder moves the stream's last
sequence and makes the takeover conflict. After the takeover is stored, the holder's next append must
be made against a view that includes it, so the holder learns it lost the job before it can renew.

Nothing here does I/O or reads a clock: times are arguments (seconds on a monotonic clock).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from schemas.envelope import Recorded
from schemas.federation import FederationBeat, FederationClaimed, FederationProvisioned, FederationReleased

LEASE_S = 8.0
"""Default lease: how long an instance may stay silent before another takes its jobs over. Its
fence stops serving after 0.7 of it (5.6 s) without an acknowledged renewal: long enough that a
loaded host's slow fsync does not restart an FL server for nothing (5 s, fenced at 3.5 s, did under
a full test suite beside two benchmarks)."""
BEAT_FRACTION = 0.2
"""A holder renews every ``lease * BEAT_FRACTION`` (1.6 s for the default 8 s lease)."""
FENCE_FRACTION = 0.7
"""A holder serves at most ``lease * FENCE_FRACTION`` after sending its latest acknowledged append:
the rest of the lease (1.5 s for a 5 s lease) is the margin in which its FL servers are killed."""


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """The current claim on a job."""

    instance: str
    incarnation: str
    term: int


class Provisioning(msgspec.Struct, frozen=True, kw_only=True):
    """A job's federation as provisioned by a holder: where its server side is stored, its address."""

    archive: str
    server: str


class Liveness(msgspec.Struct, frozen=True, kw_only=True):
    """The latest event of one incarnation: its sequence and the lease it declared."""

    instance: str
    seq: int
    lease_ms: int


class ClaimsView(msgspec.Struct, frozen=True, kw_only=True):
    """The FEDERATION stream folded.

    Attributes:
        last_seq: the last sequence folded (what the next append is made against).
        holders: job key (``tenant/job_id``) -> its current claim; absent when unclaimed or released.
        terms: job key -> its last term (kept after a release, so that terms only grow).
        provisioned: job key -> its federation, from the latest ``federation.provisioned``.
        alive: incarnation -> its latest event.
    """

    last_seq: int = 0
    holders: dict[str, Holder] = {}
    terms: dict[str, int] = {}
    provisioned: dict[str, Provisioning] = {}
    alive: dict[str, Liveness] = {}


class Sighting(msgspec.Struct, frozen=True, kw_only=True):
    """When this observer first saw an incarnation's latest event (seconds on its monotonic clock)."""

    seq: int
    at: float


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A claim to append: job ``key`` at ``term``, taken over from ``took_over_from`` (or nobody)."""

    key: str
    term: int
    took_over_from: str = ""


def job_of(subject: str) -> str | None:
    """The job key of a ``federation.<tenant>.<job_id>.<event>`` subject (``None`` for a beat)."""
    tokens = subject.split(".")
    return f"{tokens[1]}/{tokens[2]}" if len(tokens) == 4 else None


def evolve(view: ClaimsView, record: Recorded[Any]) -> ClaimsView:
    """Fold one FEDERATION record. A record at or below ``last_seq`` is a no-op; a claim whose term is
    not the job's last term + 1, and a ``provisioned`` or ``released`` that is not the current
    holder's, are stale: ignored (they move ``last_seq`` only)."""
    if record.seq <= view.last_seq:
        return view
    seq, event, key = record.seq, record.event, job_of(record.subject)
    moved = msgspec.structs.replace(view, last_seq=seq)
    match event:
        case FederationBeat(incarnation=incarnation, lease_ms=lease_ms):
            instance = record.subject.split(".")[1]
            return _alive(moved, incarnation, instance, seq, lease_ms)
        case FederationClaimed() if key is not None and event.term == view.terms.get(key, 0) + 1:
            holder = Holder(instance=event.instance, incarnation=event.incarnation, term=event.term)
            moved = msgspec.structs.replace(
                moved, holders={**view.holders, key: holder}, terms={**view.terms, key: event.term}
            )
            return _alive(moved, event.incarnation, event.instance, seq, event.lease_ms)
        case FederationProvisioned() if key is not None and _current(view, key, event):
            provisioning = Provisioning(archive=event.archive, server=event.server)
            moved = msgspec.structs.replace(moved, provisioned={**view.provisioned, key: provisioning})
            return _renewed(moved, event.incarnation, seq)
        case FederationReleased() if key is not None and _current(view, key, event):
            holders = {k: h for k, h in view.holders.items() if k != key}
            return _renewed(msgspec.structs.replace(moved, holders=holders), event.incarnation, seq)
    return moved


def _current(view: ClaimsView, key: str, event: FederationProvisioned | FederationReleased) -> bool:
    holder = view.holders.get(key)
    return holder is not None and (holder.incarnation, holder.term) == (event.incarnation, event.term)


def _alive(view: ClaimsView, incarnation: str, instance: str, seq: int, lease_ms: int) -> ClaimsView:
    liveness = Liveness(instance=instance, seq=seq, lease_ms=lease_ms)
    return msgspec.structs.replace(view, alive={**view.alive, incarnation: liveness})


def _renewed(view: ClaimsView, incarnation: str, seq: int) -> ClaimsView:
    known = view.alive.get(incarnation)
    if known is None:
        return view
    return _alive(view, incarnation, known.instance, seq, known.lease_ms)


# -- decisions ---------------------------------------------------------------------------------------


def observe(view: ClaimsView, sightings: dict[str, Sighting], now: float) -> dict[str, Sighting]:
    """``sightings`` brought up to date with ``view``: an incarnation whose latest event is new to this
    observer is seen ``now``; incarnations the view no longer knows are dropped."""
    out: dict[str, Sighting] = {}
    for incarnation, live in view.alive.items():
        seen = sightings.get(incarnation)
        out[incarnation] = (
            seen if seen is not None and seen.seq == live.seq else Sighting(seq=live.seq, at=now)
        )
    return out


def lapsed(view: ClaimsView, incarnation: str, sightings: dict[str, Sighting], now: float) -> bool:
    """Whether ``incarnation`` has been silent for its whole lease, as this observer saw it. An
    incarnation this observer has not seen yet (or not since its latest event) has not lapsed."""
    live, seen = view.alive.get(incarnation), sightings.get(incarnation)
    if live is None or seen is None or seen.seq != live.seq:
        return False
    return now - seen.at >= live.lease_ms / 1000


def claims_to_make(
    view: ClaimsView, me: str, live_jobs: Iterable[str], sightings: dict[str, Sighting], now: float
) -> list[Claim]:
    """The claims incarnation ``me`` should append now: every live job that nobody holds, and every
    one whose holder (another incarnation) has lapsed."""
    out = []
    for key in live_jobs:
        holder, term = view.holders.get(key), view.terms.get(key, 0) + 1
        if holder is None:
            out.append(Claim(key=key, term=term))
        elif holder.incarnation != me and lapsed(view, holder.incarnation, sightings, now):
            out.append(Claim(key=key, term=term, took_over_from=holder.instance))
    return out


def held(view: ClaimsView, me: str) -> set[str]:
    """The jobs incarnation ``me`` holds."""
    return {key for key, holder in view.holders.items() if holder.incarnation == me}


def serving_until(sent_at: float, lease_s: float) -> float:
    """Until when a holder may serve after a renewal it sent at ``sent_at`` was acknowledged."""
    return sent_at + lease_s * FENCE_FRACTION
