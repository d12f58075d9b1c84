"""Request routing (:mod:`gateway.routing`), pure: round robin past full replicas, rendezvous hashing, session
and prefix keys with bounded loads, the route key read off a body."""

from __future__ import annotations

from collections import Counter

import msgspec

from gateway.routing import LOAD_FACTOR, Picker, RoutedBody, leading_text, rendezvous, route_key


def test_round_robin_skips_full_replicas() -> None:
    pick = Picker("round_robin")
    assert [pick(None, ["a", "b", "c"], {}, 1) for _ in range(3)] == ["a", "b", "c"]
    assert pick(None, ["a", "b", "c"], {"a": 1, "b": 1}, 1) == "c"
    assert pick(None, ["a", "b"], {"a": 1, "b": 1}, 1) is None


def test_rendezvous_moves_only_the_keys_of_a_replica_that_left() -> None:
    replicas = ["http://h:1", "http://h:2", "http://h:3"]
    before = {k: rendezvous(k, replicas)[0] for k in map(str, range(300))}
    assert set(Counter(before.values())) == set(replicas)
    after = {k: rendezvous(k, replicas[:2])[0] for k in before}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k in before if before[k] == "http://h:3"}


def test_session_keys_stay_on_their_replica_while_it_has_room() -> None:
    pick = Picker("session")
    replicas = ["a", "b"]
    home = pick("user-1", replicas, {}, 4)
    assert home is not None
    assert all(pick("user-1", replicas, {}, 4) == home for _ in range(5))
    other = "b" if home == "a" else "a"
    assert pick("user-1", replicas, {home: 4}, 4) == other  # full: spills to the next in order
    assert pick("user-1", [other], {}, 4) == other  # its replica gone: the key moves


def test_prefix_routing_keeps_a_prefix_together_within_the_load_bound() -> None:
    pick = Picker("prefix")
    replicas = ["a", "b"]
    home = rendezvous("p", replicas)[0]
    other = "b" if home == "a" else "a"
    in_flight: dict[str, int] = {}
    chosen = []
    for _ in range(6):
        address = pick("p", replicas, in_flight, 8)
        assert address is not None
        in_flight[address] = in_flight.get(address, 0) + 1
        chosen.append(address)
    assert chosen[:3] == [home] * 3 and other in chosen  # 1.25 x average + 1 caps the home replica
    assert max(in_flight.values()) <= LOAD_FACTOR * 6 / 2 + 2  # never past 1.25 x average + 1, plus itself


def test_route_keys_come_from_the_header_the_user_or_the_prompts_leading_text() -> None:
    decode = msgspec.json.Decoder(RoutedBody).decode
    system = "You are a helpful assistant. " * 60
    chat = decode(
        msgspec.json.encode(
            {
                "model": "m",
                "user": "u1",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "question 1"},
                ],
            }
        )
    )
    chat2 = decode(
        msgspec.json.encode(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": [{"type": "text", "text": system}]},
                    {"role": "user", "content": "another question"},
                ],
            }
        )
    )
    assert route_key("session", chat, {"x-session-id": "s9"}) == "s9"
    assert route_key("session", chat, {}) == "u1"
    assert route_key("session", chat2, {}) is None
    assert route_key("round_robin", chat, {}) is None
    assert route_key("prefix", chat, {}) == route_key("prefix", chat2, {})  # the shared system prompt
    text = leading_text(chat)
    assert text is not None and text.startswith("system: You are") and len(text) == 1024
    short = decode(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert leading_text(short) == "user: hi\n"
    completion = decode(b'{"model": "m", "prompt": ["The capital of", "x"]}')
    assert leading_text(completion) == "The capital of"
    assert leading_text(decode(b'{"model": "m", "input": ["an embedding", "y"]}')) == "an embedding"
    assert route_key("prefix", decode(b'{"model": "m"}'), {}) is None
