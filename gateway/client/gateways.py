"""Several gateways behind one client: the list of URLs, which one a call tries first, and whether a
failed attempt may be sent again to the next one.

A client is given one gateway URL or several (``RESONTECH_GATEWAY_URL=http://gw-1:8080,http://gw-2:8080``).
Every gateway follows the same log, so any of them can answer any call. A call goes to the gateway
that last answered; when that one is unreachable the call moves on to the next URL, round-robin,
waiting a short backoff after each full round, until the retry deadline (:data:`RETRY_ENV`) has
passed and every URL has been tried once.

Whether a failed attempt may be repeated depends on whether the request may have reached the gateway:

- nothing was sent (the connection was refused, or not opened in time): any call is repeated;
- something may have been sent (a reset, a timeout waiting for the answer, a 502/503/504): only a
  *replayable* call is repeated: ``GET``/``PUT``/``DELETE``, a create that carries an
  ``Idempotency-Key`` (the SDK gives one to every submit and deploy), or a call described as
  replayable. Anything else (issuing an API key, creating a tenant) is not repeated blindly: the
  error says it may have been applied.

The idempotency record is the log itself (:mod:`gateway.idempotency`: the created resource's id and
its event id derive from the tenant and the key, and the stored event is read back), so a create that
gateway 1 stored before it died is recognised by gateway 2 and not made twice.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

import httpx

from core.errors import ConfigError

RETRY_ENV = "RESONTECH_GATEWAY_RETRY_S"
"""The environment variable of the retry deadline, in seconds."""
DEFAULT_RETRY_S = 30.0
"""How long a call keeps trying the gateways when several are configured, in seconds."""
MAX_BACKOFF_S = 2.0
"""The longest pause between two rounds over the gateways, in seconds."""
RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers that mean "this gateway cannot serve now" (its own 503, or a proxy's word for it)."""
REPLAYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
"""Methods whose repetition changes nothing more than the first attempt did (RFC 9110 9.2.2)."""
_HOST = re.compile(r"^(?:[A-Za-z0-9_.-]+|[0-9A-Fa-f:.]+)$")  # a name, an IPv4 or an IPv6 address
# The request was certainly not sent: no connection was made (refused, unroutable, not in time).
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# The request may have reached the gateway: the connection broke, or no answer came in time.
_MAYBE_SENT = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.TimeoutException)


def parse_urls(value: str | Sequence[str]) -> tuple[str, ...]:
    """The gateway URLs of a comma-separated string (or a sequence of them), trailing slashes dropped,
    duplicates removed, order kept.

    Raises:
        ConfigError: no URL at all, or one that is not ``http(s)://host[:port][/path]``.
    """
    items = value.split(",") if isinstance(value, str) else [p for v in value for p in v.split(",")]
    urls: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        url = _checked(item).rstrip("/")
        if url not in urls:
            urls.append(url)
    if not urls:
        raise ConfigError("no gateway URL given: set RESONTECH_GATEWAY_URL, e.g. http://127.0.0.1:8080")
    return tuple(urls)


def _checked(url: str) -> str:
    problem = f"gateway URL {url!r} is not an http:// or https:// URL with a host"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        raise ConfigError(problem) from None
    if parts.scheme not in ("http", "https") or not _HOST.match(parts.hostname or ""):
        raise ConfigError(problem)
    if parts.query or parts.fragment or any(c.isspace() for c in url):
        raise ConfigError(f"gateway URL {url!r} may not carry a query, a fragment or spaces")
    return url


def retry_seconds(value: float | None, env: Mapping[str, str], urls: Sequence[str]) -> float:
    """The retry deadline: ``value``, else :data:`RETRY_ENV`, else :data:`DEFAULT_RETRY_S` with several
    URLs and 0 with one (a single gateway that is down is said at once, as a stopped dev stack should
    be; set the deadline to ride out restarts behind a load balancer).

    Raises:
        ConfigError: the environment's value is not a number of seconds >= 0.
    """
    if value is None and env.get(RETRY_ENV):
        raw = env[RETRY_ENV]
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value >= 0 or value == float("inf"):
            raise ConfigError(f"{RETRY_ENV} must be a number of seconds >= 0, got {raw!r}")
    if value is None:
        return DEFAULT_RETRY_S if len(urls) > 1 else 0.0
    if value < 0:
        raise ConfigError(f"the retry deadline must be >= 0 seconds, got {value}")
    return value


def replayable(method: str, headers: Mapping[str, str] | None) -> bool:
    """True when sending the request twice changes nothing more than sending it once: an idempotent
    method, or a request with an ``Idempotency-Key``."""
    keyed = any(name.lower() == "idempotency-key" for name in headers or {})
    return method.upper() in REPLAYABLE_METHODS or keyed


class Gateways:
    """The gateway URLs of one client and the one its calls try first: the last that answered.

    Shared by the threads (or tasks) of a client: the preferred index is a single int, and a race
    between two updates only changes which healthy gateway the next call tries first.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = tuple(urls)
        self._first = 0

    @property
    def current(self) -> str:
        """The URL the next call tries first."""
        return self.urls[self._first]

    def rotated(self) -> tuple[str, ...]:
        """Every URL, starting from :attr:`current` (for the feed, which rotates on its own)."""
        return self.urls[self._first :] + self.urls[: self._first]

    def attempts(self, retry_s: float, clock: Callable[[], float] = time.monotonic) -> Attempts:
        """The attempts of one call, which gives up once ``retry_s`` seconds have passed (and every
        URL has been tried once)."""
        return Attempts(self, retry_s, clock)

    def _answered(self, index: int) -> None:
        self._first = index

    def _failed(self, index: int) -> None:
        if self._first == index:  # another call may already have moved on: do not skip a good one
            self._first = (index + 1) % len(self.urls)


class Attempts:
    """The attempts of one logical call: the URL of each and, after a failure, whether another
    follows and after how long. Sending is the client's own (sync or asyncio)."""

    def __init__(self, gateways: Gateways, retry_s: float, clock: Callable[[], float]) -> None:
        self.gateways = gateways
        self._clock = clock
        self._deadline = clock() + retry_s
        self._start = gateways._first
        self._tried = 0
        self._backoff = 0.1

    @property
    def index(self) -> int:
        return (self._start + self._tried) % len(self.gateways.urls)

    @property
    def url(self) -> str:
        """The base URL of the current attempt."""
        return self.gateways.urls[self.index]

    def after_error(self, exc: httpx.TransportError, replayable: bool) -> float | None:
        """After an attempt that got no answer: the seconds to wait before the next attempt, or
        ``None`` to give up (the request may have been sent and is not replayable, or time is up)."""
        retry = isinstance(exc, _NOT_SENT) or (replayable and isinstance(exc, _MAYBE_SENT))
        return self._next() if retry else None

    def after_answer(self, status: int, replayable: bool) -> float | None:
        """After an answer: ``None`` when it is the call's answer, else (a 502/503/504 to a replayable
        call, time left) the seconds to wait before asking the next gateway."""
        index = self.index
        if status in RETRY_STATUSES and replayable:
            wait = self._next()
            if wait is not None:
                return wait
        self.gateways._answered(index)
        return None

    def _next(self) -> float | None:
        self.gateways._failed(self.index)
        self._tried += 1
        count = len(self.gateways.urls)
        left = self._deadline - self._clock()
        if self._tried >= count and left <= 0:
            return None
        if self._tried % count:
            return 0.0  # the next gateway, at once
        wait = min(self._backoff, max(left, 0.0))  # a full round failed: pause before the next
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        return wait

    def unreachable_message(self, method: str, path: str, exc: httpx.TransportError, replayable: bool) -> str:
        """The one line that says no gateway answered (and, for a call that may have reached one and
        is not replayable, that it may have been applied)."""
        where = " or ".join(self.gateways.urls)
        if replayable or isinstance(exc, _NOT_SENT) or not isinstance(exc, _MAYBE_SENT):
            return f"cannot reach the gateway at {where}: {_words(exc)}"
        return (
            f"cannot reach the gateway at {where}: {_words(exc)} during {method} {path}; "
            "it may have been applied: check before repeating it"
        )


def _words(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
