"""The ledger's keys, periods and prices have one home each: the fold calls the named helpers
(:func:`projections.ledger.line_key`, :func:`~projections.ledger.payout_key`,
:func:`~projections.ledger.period_of`, :func:`core.pricing.table_at`, :func:`core.pricing.round_half_up`),
so editing a helper changes what the fold does."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import core.pricing
import projections.ledger as ledger
from core.streams import metering_subject
from schemas.envelope import Recorded
from schemas.metering import TokensServed, UsageTick

APRIL_MS = 1_775_001_600_000  # 2026-04-01T00:00:00Z
FACTS: dict[str, Any] = {"work_id": "x", "epoch": 1, "provider": "p1", "gpu_type": "H100", "tier": "gold"}


def fold(*events: UsageTick | TokensServed) -> ledger.LedgerState:
    state = ledger.LedgerState()
    for seq, event in enumerate(events, 1):
        subject = metering_subject("acme", "w1", f"a{seq}", type(event))
        recorded = Recorded(stream="METERING", seq=seq, subject=subject, time_ns=0, msg_id="", event=event)
        state = ledger.evolve(state, recorded)
    return state


def usage(start_ms: int = APRIL_MS) -> UsageTick:
    return UsageTick(
        work_kind="job",
        assignment_id="a1",
        pool="shared",
        start_ms=start_ms,
        end_ms=start_ms + 60_000,
        gpu_ms=60_000,
        **FACTS,
    )


def served() -> TokensServed:
    return TokensServed(
        assignment_id="a2", start_ms=APRIL_MS, end_ms=APRIL_MS + 1, tokens=5, source="g", **FACTS
    )


def test_the_fold_keys_lines_and_payouts_by_the_named_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger, "period_of", lambda ms: f"month-of-{ms}")
    monkeypatch.setattr(ledger, "line_key", lambda *parts: "line:" + ",".join(map(str, parts)))
    monkeypatch.setattr(ledger, "payout_key", lambda *parts: "payout:" + ",".join(parts))
    state = fold(usage(), served())
    end = APRIL_MS + 60_000
    assert sorted(state.lines) == [
        f"line:acme,month-of-{APRIL_MS + 1},endpoint,x,H100,shared,1",
        f"line:acme,month-of-{end},job,x,H100,shared,1",
    ]
    assert list(state.payouts) == [f"payout:p1,month-of-{end},gold"]


def test_the_helpers_give_the_keys_the_fold_stores() -> None:
    state = fold(usage())
    assert list(state.lines) == [ledger.line_key("acme", "2026-04", "job", "x", "H100", "shared", 1)]
    assert list(state.payouts) == [ledger.payout_key("p1", "2026-04", "gold")]


def test_pricing_calls_its_named_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    charge, payout, _ = core.pricing.price(usage())
    assert charge > payout > 0
    monkeypatch.setattr(core.pricing, "round_half_up", lambda numerator, denominator: 7)
    assert core.pricing.price(usage()) == (7, 7, 1)
    monkeypatch.setattr(
        core.pricing, "table_at", lambda ms, tables: msgspec.structs.replace(tables[0], version=9)
    )
    assert core.pricing.price(usage())[2] == 9
