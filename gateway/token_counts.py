"""Token counts read off the engines' own responses, for metering (:mod:`gateway.token_meter`).

Why in the gateway: the tenant is billed for what the kernel counts, not for what a provider's agent
says it served, and inference traffic never passes through the agent anyway. Every OpenAI-shaped
response carries ``usage`` (``prompt_tokens``, ``completion_tokens``): the tokens of a request are
their sum (an embedding has no completion tokens).

* **A plain response** (completions, chat, embeddings): the proxy reads the whole body before it
  answers (one send, no chunking) and :func:`tokens_of` reads ``usage`` from it.
* **A stream** (``"stream": true``): an engine reports usage only in a final chunk, and only when the
  request asks for it (``stream_options.include_usage``). :func:`ask_for_usage` adds that to the
  request when the client did not; :class:`SseUsage` then reads the usage chunk and, when the client
  had not asked for it, does not pass it through: the client sees exactly the events it would have
  seen. The gateway never turns on ``continuous_usage_stats`` (usage on every chunk) by itself.

**The replica's count is its provider's word**, so what is billed is bounded by what the gateway saw
itself (:class:`TokenBound`, :func:`billable`): the prompt tokens by the request's bytes (a token is
at least one byte of the input, whether text or token ids; plus :data:`TEMPLATE_TOKENS` for the chat
template an engine wraps a prompt in), and the completion tokens by ``max_tokens`` (or
``max_completion_tokens``) times ``n`` when the request set them, and by the bytes of the answer the
replica sent back (every generated token is at least a byte of it). A replica that answers ``usage``
of 10**12 tokens for a five-word question bills the few hundred its request and answer could hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

_SEPARATORS = (b"\n\n", b"\r\n\r\n")


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Reply(msgspec.Struct):
    """What metering reads of a response (or of one streamed chunk); everything else is skipped."""

    usage: _Usage | None = None


_DECODE_REPLY = msgspec.json.Decoder(_Reply).decode

TEMPLATE_TOKENS = 256
"""Prompt tokens an engine may add beyond one per byte of the request: a chat template's role markers
and special tokens (a few per message; each message costs far more bytes of JSON than that)."""


class _Limits(msgspec.Struct):
    """What bounds a completion in an OpenAI request; everything else is skipped."""

    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None


_DECODE_LIMITS = msgspec.json.Decoder(_Limits).decode


@dataclass(frozen=True, slots=True)
class TokenBound:
    """The most tokens one request can be billed, from what the gateway saw of it.

    Attributes:
        prompt: prompt tokens: the request's bytes plus :data:`TEMPLATE_TOKENS`.
        completion: completion tokens: ``max_tokens`` (or ``max_completion_tokens``) times ``n``;
            ``None`` when the request set no limit (then only the answer's bytes bound them).
    """

    prompt: int
    completion: int | None = None


def bound_of(body: bytes) -> TokenBound:
    """The bound of a request whose body (as forwarded) is ``body``."""
    completion = None
    try:
        limits = _DECODE_LIMITS(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        limits = _Limits()  # a limit the engine cannot read either: the answer's bytes bound it
    most = limits.max_completion_tokens if limits.max_completion_tokens is not None else limits.max_tokens
    if most is not None and most >= 0:
        completion = most * max(1, limits.n or 1)
    return TokenBound(prompt=len(body) + TEMPLATE_TOKENS, completion=completion)


def billable(prompt: int, completion: int, bound: TokenBound | None, answer_bytes: int | None) -> int:
    """The tokens billed for a replica's ``usage`` of ``prompt`` and ``completion`` tokens: each
    count at least 0 and at most what ``bound`` and the answer's ``answer_bytes`` allow (``None``:
    unbounded, for a count read outside a request)."""
    prompt, completion = max(0, prompt), max(0, completion)
    if bound is not None:
        prompt = min(prompt, bound.prompt)
        if bound.completion is not None:
            completion = min(completion, bound.completion)
    if answer_bytes is not None:
        completion = min(completion, answer_bytes)
    return prompt + completion


def tokens_of(
    document: bytes, bound: TokenBound | None = None, answer_bytes: int | None = None
) -> int | None:
    """The prompt plus completion tokens of a JSON response or chunk, or ``None`` without usage
    (or when it is not JSON of that shape); with ``bound`` and ``answer_bytes``, as
    :func:`billable` bounds them."""
    try:
        usage = _DECODE_REPLY(document).usage
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if usage is None:
        return None
    return billable(usage.prompt_tokens, usage.completion_tokens, bound, answer_bytes)


def ask_for_usage(body: bytes) -> tuple[bytes, bool]:
    """The body of a streaming request with ``stream_options.include_usage`` set, and whether the
    gateway set it (then the usage chunk is the gateway's, not the client's).

    A body the client already asked usage with, or whose ``stream_options`` is not an object (the
    engine will refuse it), is returned unchanged.
    """
    try:
        document: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body, False
    if not isinstance(document, dict):
        return body, False
    options = document.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        return body, False
    if options.get("include_usage") is True:
        return body, False
    options = {k: v for k, v in options.items() if k != "continuous_usage_stats"}
    options["include_usage"] = True
    document["stream_options"] = options
    return msgspec.json.encode(document), True


def _event_end(buffer: bytes, start: int) -> tuple[int, int]:
    """The end of the first complete SSE event in ``buffer[start:]`` and its separator's length,
    or ``(-1, 0)``."""
    best, size = -1, 0
    for separator in _SEPARATORS:
        at = buffer.find(separator, start)
        if at != -1 and (best == -1 or at < best):
            best, size = at, len(separator)
    return best, size


def _data_of(event: bytes) -> bytes:
    """The ``data:`` of one SSE event (its data lines joined), empty when it has none."""
    lines = event.replace(b"\r\n", b"\n").split(b"\n")
    parts = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    return b"\n".join(parts)


class SseUsage:
    """Reads usage off a server-sent event stream as it passes, event by event.

    Args:
        strip: drop the events that carry usage (the gateway asked for them, the client did not).
        bound: what the request can be billed at most (:func:`bound_of`); ``None``: unbounded.

    Attributes:
        tokens: the tokens of the latest usage seen (usage is cumulative: the last one counts),
            bounded by ``bound`` and by the bytes the replica sent up to it.
        received: bytes of the stream received from the replica so far.
    """

    def __init__(self, *, strip: bool, bound: TokenBound | None = None) -> None:
        self.strip = strip
        self.bound = bound
        self.tokens = 0
        self.received = 0
        self._buffer = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to pass on for ``chunk``: whole events only (a partial one waits for its end)."""
        self.received += len(chunk)
        buffer = self._buffer + chunk
        out: list[bytes] = []
        start = 0
        while True:
            end, size = _event_end(buffer, start)
            if end == -1:
                break
            event = buffer[start : end + size]
            if self._keep(buffer[start:end]):
                out.append(event)
            start = end + size
        self._buffer = buffer[start:]
        return b"".join(out)

    def finish(self) -> bytes:
        """What is left at the end of the stream (an unterminated last event), passed on as it is."""
        rest, self._buffer = self._buffer, b""
        if rest and b'"usage"' in rest:
            tokens = tokens_of(_data_of(rest), self.bound, self.received)
            if tokens is not None:
                self.tokens = tokens
        return rest

    def _keep(self, event: bytes) -> bool:
        if b'"usage"' not in event:  # the cheap test first: most chunks carry no usage
            return True
        tokens = tokens_of(_data_of(event), self.bound, self.received)
        if tokens is None:
            return True
        self.tokens = tokens
        return not self.strip
