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
"""

from __future__ import annotations

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


def tokens_of(document: bytes) -> int | None:
    """The prompt plus completion tokens of a JSON response or chunk, or ``None`` without usage
    (or when it is not JSON of that shape)."""
    try:
        usage = _DECODE_REPLY(document).usage
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if usage is None:
        return None
    return max(0, usage.prompt_tokens) + max(0, usage.completion_tokens)


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

    Attributes:
        tokens: the tokens of the latest usage seen (usage is cumulative: the last one counts).
    """

    def __init__(self, *, strip: bool) -> None:
        self.strip = strip
        self.tokens = 0
        self._buffer = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to pass on for ``chunk``: whole events only (a partial one waits for its end)."""
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
            tokens = tokens_of(_data_of(rest))
            if tokens is not None:
                self.tokens = tokens
        return rest

    def _keep(self, event: bytes) -> bool:
        if b'"usage"' not in event:  # the cheap test first: most chunks carry no usage
            return True
        tokens = tokens_of(_data_of(event))
        if tokens is None:
            return True
        self.tokens = tokens
        return not self.strip
