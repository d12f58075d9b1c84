"""Routing policies: which ready replica takes a request, per the endpoint's ``routing``.

* ``round_robin`` (the default): replicas in turn, skipping any that holds its limit.
* ``session``: the request's session key (an ``x-session-id`` header, else the OpenAI ``user``
  field of the body) is hashed with each replica's address, and the replica with the highest score
  takes it (rendezvous, or highest-random-weight, hashing). The same key goes to the same replica
  while that replica serves, has room and is not ejected; when it dies only the keys it held move,
  each to its own next-highest replica. No key: round robin.
* ``prefix``: the key is a hash of the prompt's leading text (:data:`PREFIX_CHARS` characters of
  the chat messages, role and text in order, of a completion's ``prompt`` or of an embedding's
  ``input``), so requests sharing a long system prompt meet on the replica whose prefix cache holds
  it. Rendezvous order, with a bound on load imbalance (consistent hashing with bounded loads): a
  replica is passed over while it holds more than :data:`LOAD_FACTOR` times the average in-flight
  count plus one, or its limit. No prompt: round robin.

What is read of a body for this is :class:`RoutedBody` (``user``, ``messages``, ``prompt``,
``input``), decoded once with the ``model`` and ``stream`` the proxy reads anyway; the messages and
prompts stay raw JSON (a slice of the body, not decoded) unless the policy is ``prefix``. The body
goes to the replica byte for byte all the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from schemas.endpoints import Routing

PREFIX_CHARS = 1024
"""How much of a prompt's leading text names its prefix (about 250 tokens: past a shared system
prompt's start, short of a question appended to it)."""
LOAD_FACTOR = 1.25
SESSION_HEADER = "x-session-id"
"""A session key sent as a header (takes precedence over the body's ``user``); never forwarded."""


class RoutedBody(msgspec.Struct):
    """What the proxy reads of an OpenAI request body; every other field passes through unread."""

    model: str
    stream: bool = False
    user: str | None = None
    messages: msgspec.Raw = msgspec.Raw(b"")
    prompt: msgspec.Raw = msgspec.Raw(b"")
    input: msgspec.Raw = msgspec.Raw(b"")


class _Part(msgspec.Struct):
    text: str = ""


class _Message(msgspec.Struct):
    role: str = ""
    content: str | list[_Part] | None = None


_MESSAGES = msgspec.json.Decoder(list[_Message]).decode
_PROMPT = msgspec.json.Decoder(Any).decode


def leading_text(body: RoutedBody, chars: int = PREFIX_CHARS) -> str | None:
    """The first ``chars`` characters of the prompt (messages rendered ``role: text`` in order, a
    completion's ``prompt``, an embedding's ``input``; of a batch, its first), ``None`` when the body
    has none or it does not decode."""
    try:
        if body.messages:
            out: list[str] = []
            size = 0
            for m in _MESSAGES(body.messages):
                text = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content or [])
                out.append(f"{m.role}: {text}\n")
                size += len(out[-1])
                if size >= chars:
                    break
            return "".join(out)[:chars]
        if raw := body.prompt or body.input:
            prompt: object = _PROMPT(raw)
            while isinstance(prompt, list) and prompt and isinstance(prompt[0], list | str):
                prompt = prompt[0]  # a batch: its first prompt
            return (prompt if isinstance(prompt, str) else repr(prompt))[:chars]
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return None


def route_key(policy: Routing, body: RoutedBody, headers: Mapping[str, str]) -> str | None:
    """The key a request is routed on under ``policy`` (``None``: round robin)."""
    if policy == "session":
        return headers.get(SESSION_HEADER) or body.user or None
    if policy == "prefix":
        text = leading_text(body)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest() if text else None
    return None


def _score(key: str, address: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{address}".encode(), digest_size=8).digest(), "big")


def rendezvous(key: str, addresses: Sequence[str]) -> list[str]:
    """``addresses`` from the highest score for ``key`` to the lowest."""
    return sorted(addresses, key=lambda a: _score(key, a), reverse=True)


class Picker:
    """One endpoint's policy as a :data:`gateway.queueing.Pick` (the round-robin cursor is its state)."""

    def __init__(self, policy: Routing) -> None:
        self.policy = policy
        self.cursor = 0

    def __call__(
        self, key: str | None, candidates: Sequence[str], in_flight: dict[str, int], limit: int
    ) -> str | None:
        if not candidates:
            return None
        if key is None or self.policy == "round_robin":
            return self.in_turn(candidates, in_flight, limit)
        bound = float(limit - 1)  # the most a replica may hold to take one more
        if self.policy == "prefix":
            average = sum(in_flight.get(a, 0) for a in candidates) / len(candidates)
            bound = min(bound, LOAD_FACTOR * average + 1)
        for address in rendezvous(key, candidates):
            if in_flight.get(address, 0) <= bound:
                return address
        return self.in_turn(candidates, in_flight, limit)

    def in_turn(self, candidates: Sequence[str], in_flight: dict[str, int], limit: int) -> str | None:
        n = len(candidates)
        for i in range(n):
            address = candidates[(self.cursor + i) % n]
            if in_flight.get(address, 0) < limit:
                self.cursor = (self.cursor + i + 1) % max(n, 1)
                return address
        return None
