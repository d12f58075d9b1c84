"""A federation's claim decisions (:mod:`core.federation_claims`), pure: who holds a job, when a lease lapses,
stale claims ignored, a release freeing the job at once."""

from __future__ import annotations

from typing import Any

import pytest

from core.federation_claims import (
    ClaimsView,
    Sighting,
    claims_to_make,
    evolve,
    held,
    lapsed,
    observe,
    serving_until,
)
from core.streams import federation_beat_subject, federation_subject
from schemas.envelope import Recorded
from schemas.federation import FederationBeat, FederationClaimed, FederationProvisioned, FederationReleased

JOB = "acme/j1"


def _rec(seq: int, event: Any, job: str = JOB) -> Recorded[Any]:
    if isinstance(event, FederationBeat):
        subject = federation_beat_subject("inst-" + event.incarnation)
    else:
        tenant, job_id = job.split("/")
        subject = federation_subject(tenant, job_id, event)
    return Recorded(stream="FEDERATION", seq=seq, subject=subject, time_ns=0, msg_id=f"m{seq}", event=event)


def _claimed(incarnation: str, term: int, took_over_from: str = "") -> FederationClaimed:
    return FederationClaimed(
        instance="inst-" + incarnation,
        incarnation=incarnation,
        term=term,
        lease_ms=5000,
        took_over_from=took_over_from,
    )


def _fold(*records: Recorded[Any]) -> ClaimsView:
    view = ClaimsView()
    for record in records:
        view = evolve(view, record)
    return view


def test_a_job_nobody_holds_is_claimed_at_term_one_and_then_held() -> None:
    view = ClaimsView()
    [claim] = claims_to_make(view, "a", [JOB], {}, now=0.0)
    assert (claim.key, claim.term, claim.took_over_from) == (JOB, 1, "")
    view = _fold(_rec(1, _claimed("a", 1)))
    assert held(view, "a") == {JOB} and held(view, "b") == set()
    assert claims_to_make(view, "a", [JOB], observe(view, {}, 0.0), now=100.0) == []  # its own


def test_a_holder_lapses_only_after_a_whole_lease_without_a_new_event_as_this_observer_saw_it() -> None:
    view = _fold(_rec(1, _claimed("a", 1)))
    seen = observe(view, {}, now=10.0)  # b first sees a's claim at 10 s
    assert not lapsed(view, "a", seen, now=14.9) and claims_to_make(view, "b", [JOB], seen, now=14.9) == []
    [claim] = claims_to_make(view, "b", [JOB], seen, now=15.0)
    assert (claim.term, claim.took_over_from) == (2, "inst-a")
    # One beat of a's at 14 s (seen then) and the clock starts again from it.
    view = evolve(view, _rec(2, FederationBeat(incarnation="a", lease_ms=5000)))
    seen = observe(view, seen, now=14.0)
    assert not lapsed(view, "a", seen, now=18.9) and lapsed(view, "a", seen, now=19.0)
    # An observer that only just started (sightings empty) has not seen anything lapse yet.
    assert not lapsed(view, "a", {}, now=1e9)
    assert observe(view, {}, now=50.0)["a"] == Sighting(seq=2, at=50.0)


def test_a_lease_is_the_holders_own() -> None:
    short = FederationClaimed(instance="inst-a", incarnation="a", term=1, lease_ms=1000)
    view = _fold(_rec(1, short))
    seen = observe(view, {}, now=0.0)
    assert lapsed(view, "a", seen, now=1.0) and not lapsed(view, "a", seen, now=0.99)


def test_stale_claims_provisionings_and_releases_are_ignored() -> None:
    view = _fold(_rec(1, _claimed("a", 1)), _rec(2, _claimed("b", 1)))  # b's was made on a stale view
    assert view.holders[JOB].incarnation == "a" and view.last_seq == 2
    view = evolve(view, _rec(3, _claimed("b", 3)))  # a term that skips one: stale too
    assert view.holders[JOB].incarnation == "a" and view.terms[JOB] == 1
    stale = FederationProvisioned(instance="inst-b", incarnation="b", term=1, archive="x", server="h:1")
    view = evolve(view, _rec(4, stale))
    assert JOB not in view.provisioned
    view = evolve(view, _rec(5, FederationReleased(instance="inst-b", incarnation="b", term=1)))
    assert view.holders[JOB].incarnation == "a"
    # A record at or below the view's sequence is a no-op: folding twice gives the same view.
    assert evolve(view, _rec(1, _claimed("b", 2))) == view


def test_a_provisioning_outlives_its_claim_and_a_release_frees_the_job_at_once() -> None:
    mine = FederationProvisioned(instance="inst-a", incarnation="a", term=1, archive="k1", server="h:1")
    view = _fold(_rec(1, _claimed("a", 1)), _rec(2, mine))
    assert view.provisioned[JOB].archive == "k1" and view.alive["a"].seq == 2
    view = evolve(view, _rec(3, FederationReleased(instance="inst-a", incarnation="a", term=1)))
    assert JOB not in view.holders and view.terms[JOB] == 1
    [claim] = claims_to_make(view, "b", [JOB], observe(view, {}, 0.0), now=0.0)  # at once, no lease
    assert (claim.term, claim.took_over_from) == (2, "")
    view = evolve(view, _rec(4, _claimed("b", 2)))
    assert view.provisioned[JOB].archive == "k1"  # b serves the federation a provisioned


def test_a_holder_stops_serving_well_before_anyone_may_take_over() -> None:
    sent = 100.0  # the holder sent its renewal then; an observer sees it no earlier
    assert serving_until(sent, 5.0) == pytest.approx(103.5)
    view = _fold(_rec(1, _claimed("a", 1)))
    seen = observe(view, {}, now=sent)
    assert not lapsed(view, "a", seen, now=serving_until(sent, 5.0) + 1.0)
