"""The event catalog: committed samples decode, schemas export, old versions upcast."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from ops.cli import main
from schemas._base import Event, upcast, upcaster
from schemas.catalog import BY_TAG, EVENT_TYPES, current_types, decode, encode, json_schemas
from schemas.jobs import JobStarted
from schemas.values import AssignmentRef

SAMPLES = Path(__file__).resolve().parents[2] / "schemas" / "samples"


def test_every_event_tag_and_version_has_a_committed_sample() -> None:
    committed = {p.name.removesuffix(".json") for p in SAMPLES.glob("*.json")}
    assert committed == set(BY_TAG), "add a sample for every new tag; never delete an old one"


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_committed_sample_decodes_and_round_trips(path: Path) -> None:
    data = path.read_bytes()
    tag = json.loads(data)["type"]
    event = decode(tag.split(".", 1)[0], data)
    assert type(event).event_tag() == tag or type(event) in current_types()
    assert json.loads(encode(event)) == json.loads(data)


def test_stored_events_tolerate_unknown_fields() -> None:
    """Strict at the edge, tolerant inside: a newer writer's extra field does not break old readers."""
    data = json.loads((SAMPLES / "job.submitted.json").read_bytes())
    data["added_by_a_newer_writer"] = {"x": 1}
    event = decode("job", json.dumps(data).encode())
    assert type(event).event_tag() == "job.submitted"


def test_a_ready_replica_stored_before_replicas_took_a_key_decodes_without_one() -> None:
    data = json.loads((SAMPLES / "endpoint.replica_ready.json").read_bytes())
    del data["api_key"]
    event = decode("endpoint", json.dumps(data).encode())
    assert type(event).event_tag() == "endpoint.replica_ready" and event.api_key == ""  # type: ignore[attr-defined]


def test_events_are_frozen_keyword_only_with_explicit_tags() -> None:
    for cls in EVENT_TYPES:
        assert cls.__struct_config__.frozen, cls
        fields = cls.__struct_fields__
        if fields:
            with pytest.raises(TypeError):
                cls(*range(len(fields)))  # keyword-only: positional arguments are refused
        assert "." in cls.event_tag() and "__" not in cls.event_tag(), cls
        assert cls.event_tag().split(".", 1)[0] == cls.event_family()


def test_a_breaking_change_is_a_new_tag_with_an_upcaster() -> None:
    class Resized(Event, tag="test.resized"):
        gpus: int

    class ResizedV2(Event, tag="test.resized@2"):
        gpus_per_shard: int
        shards: int = 1

    @upcaster(Resized)
    def _(old: Resized) -> ResizedV2:
        return ResizedV2(gpus_per_shard=old.gpus)

    decoder = msgspec.json.Decoder(Resized | ResizedV2)
    old = upcast(decoder.decode(b'{"type":"test.resized","gpus":4}'))
    new = upcast(decoder.decode(b'{"type":"test.resized@2","gpus_per_shard":2,"shards":3}'))
    assert old == ResizedV2(gpus_per_shard=4)
    assert new == ResizedV2(gpus_per_shard=2, shards=3)
    assert (ResizedV2.event_name(), ResizedV2.event_version(), Resized.event_version()) == ("resized", 2, 1)
    with pytest.raises(ValueError, match="already registered"):
        upcaster(Resized)(lambda old: old)


def test_json_schema_export_covers_every_event(tmp_path: Path) -> None:
    assert main(["schemas", "export", str(tmp_path)]) == 0
    index = json.loads((tmp_path / "index.json").read_text())
    assert set(index) == set(BY_TAG)
    for tag in BY_TAG:
        schema = json.loads((tmp_path / f"{tag}.schema.json").read_text())
        body = schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]
        sample = json.loads((SAMPLES / f"{tag}.json").read_text())
        assert set(sample) <= set(body["properties"]), tag
        assert body["properties"]["type"]["enum"] == [tag]


def test_a_field_group_is_the_events_own_fields_first_and_its_exported_description() -> None:
    """A group of fields (``Fields``) nests nothing: its fields lead the event's JSON, in order, and the
    exported schema's description carries the group's docstring too."""
    assert issubclass(JobStarted, AssignmentRef)
    event = JobStarted(assignment_id="a1", worker_id="w1", slot=0, epoch=2)
    assert list(json.loads(encode(event))) == ["type", "assignment_id", "worker_id", "slot", "epoch"]
    description = json_schemas()["job.started"]["description"]
    assert "fencing token" in description and description.startswith("An agent started a shard")


def test_an_endpoint_deployed_before_queues_and_routing_decodes_with_their_defaults() -> None:
    data = json.loads((SAMPLES / "endpoint.deployed.json").read_bytes())
    for field in ("max_concurrency", "max_queue", "queue_timeout_s", "routing"):
        del data[field]
    event = decode("endpoint", json.dumps(data).encode())
    assert (event.max_concurrency, event.max_queue, event.queue_timeout_s, event.routing) == (  # type: ignore[attr-defined]
        8,
        64,
        120.0,
        "round_robin",
    )
