"""Replay is a contract: the committed golden history rebuilds the committed projections exactly, and
folding it twice (or each record twice) changes nothing. Nothing here regenerates the golden files:
``python -m tests.golden.make --bless`` does, on purpose."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import msgspec
import pytest

from projections import ALL
from projections.base import Projection, copy_state, state_hash
from schemas.envelope import Recorded
from tests.golden.make import HASHES, HISTORY, PROJECTIONS, build_history, dump_history, load_history, render
from tests.golden.make import stream_records as records_of

_IDS = [p.name for p in ALL]


@pytest.fixture(scope="module")
def history() -> list[Recorded[Any]]:
    return load_history(HISTORY)


@pytest.fixture(scope="module")
def hashes() -> dict[str, str]:
    committed: dict[str, str] = json.loads(HASHES.read_text())
    return committed


def test_history_is_what_the_scenario_writes() -> None:
    assert dump_history(build_history()) == HISTORY.read_text()


def test_history_is_well_formed(history: list[Recorded[Any]]) -> None:
    per_stream: dict[str, list[int]] = {}
    for record in history:
        per_stream.setdefault(record.stream, []).append(record.seq)
    for stream, seqs in per_stream.items():
        assert seqs == list(range(1, len(seqs) + 1)), stream
    assert {p.stream for p in ALL} <= set(per_stream)
    assert len({r.msg_id for r in history}) == len(history)
    times = [r.time_ns for r in history]
    assert times == sorted(times)
    assert Counter(type(r.event).__name__ for r in history)["UsageTick"] >= 50


@pytest.mark.parametrize("projection", ALL, ids=_IDS)
def test_history_rebuilds_the_committed_projection(
    projection: Projection[Any], history: list[Recorded[Any]], hashes: dict[str, str]
) -> None:
    state = projection.fold(records_of(projection, history))
    assert render(state) == (PROJECTIONS / f"{projection.name}.json").read_text()
    assert state_hash(state) == hashes[projection.name]


@pytest.mark.parametrize("projection", ALL, ids=_IDS)
def test_committed_projection_decodes_into_the_same_state(
    projection: Projection[Any], history: list[Recorded[Any]]
) -> None:
    state = projection.fold(records_of(projection, history))
    committed = (PROJECTIONS / f"{projection.name}.json").read_bytes()
    snapshot = msgspec.json.decode(committed, type=projection.state_type)
    assert snapshot == state
    assert state_hash(snapshot) == state_hash(state)


@pytest.mark.parametrize("projection", ALL, ids=_IDS)
def test_folding_twice_gives_the_same_hash(projection: Projection[Any], history: list[Recorded[Any]]) -> None:
    records = records_of(projection, history)
    once = projection.fold(records)
    expected = state_hash(once)

    doubled = projection.fold(r for record in records for r in (record, record))
    assert state_hash(doubled) == expected

    replayed = projection.fold(records, state=copy_state(projection, once))
    assert state_hash(replayed) == expected
    assert state_hash(once) == expected


@pytest.mark.parametrize("projection", ALL, ids=_IDS)
def test_resuming_from_a_snapshot_midway_gives_the_same_hash(
    projection: Projection[Any], history: list[Recorded[Any]]
) -> None:
    records = records_of(projection, history)
    half = len(records) // 2
    snapshot = copy_state(projection, projection.fold(records[:half]))
    resumed = projection.fold(records, state=snapshot)
    assert state_hash(resumed) == state_hash(projection.fold(records))
