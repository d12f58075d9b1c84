"""API bodies made from records (:mod:`gateway.bodies`): fields carried by name, the rest given."""

from __future__ import annotations

import msgspec
import pytest

from gateway.bodies import carried


class Record(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str
    label: str
    issued_ns: int
    secret: str = "never shown"


class View(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str
    label: str
    issued_at: str
    revoked: bool = False


RECORD = Record(key_id="k1", label="ci", issued_ns=5)


def test_fields_of_the_same_name_are_carried_and_the_rest_given() -> None:
    assert carried(View, RECORD, issued_at="then") == View(key_id="k1", label="ci", issued_at="then")


def test_a_given_field_wins_over_the_records_and_a_missing_one_keeps_its_default() -> None:
    view = carried(View, RECORD, issued_at="then", label="renamed")
    assert (view.label, view.revoked) == ("renamed", False)


def test_a_required_field_neither_carried_nor_given_is_an_error() -> None:
    with pytest.raises(TypeError):
        carried(View, RECORD)
