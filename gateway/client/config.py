"""Where the SDK connects and with which key: arguments, the environment, or `resontech login`'s file."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.client.gateways import parse_urls, retry_seconds

CREDENTIALS = (
    Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "resontech" / "credentials.json"
)
"""Where `resontech login` keeps the gateway URL(s) and key (mode 0600)."""
DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass(frozen=True)
class Config:
    """Where a client connects and with which key.

    Attributes:
        urls: the gateways, in the order given (one or more).
        key: the API key, or ``None``.
        retry_s: how long a call keeps trying the gateways when one cannot answer, in seconds
            (see :mod:`gateway.client.gateways`).
    """

    urls: tuple[str, ...]
    key: str | None
    retry_s: float = 0.0

    @property
    def url(self) -> str:
        """The gateway URLs as configured: comma-separated (one URL when there is one)."""
        return ",".join(self.urls)


def resolve(
    url: str | Sequence[str] | None = None,
    key: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    retry_s: float | None = None,
) -> Config:
    """Where to connect and with which key: arguments, then ``RESONTECH_GATEWAY_URL`` /
    ``RESONTECH_API_KEY``, then the file `resontech login` wrote.

    Args:
        url: one gateway URL, several comma-separated, or a sequence of them.
        key: the API key.
        env: the environment to read (default ``os.environ``).
        retry_s: the retry deadline in seconds; default ``RESONTECH_GATEWAY_RETRY_S``, else 30 with
            several URLs and 0 (one attempt) with one.

    Raises:
        ConfigError: a URL that is not ``http(s)://host[:port]``, or a malformed retry deadline (one
            line naming it).
    """
    env = os.environ if env is None else env
    stored: dict[str, str] = {}
    if CREDENTIALS.exists():
        with contextlib.suppress(ValueError, OSError):
            stored = json.loads(CREDENTIALS.read_text())
    urls = parse_urls(url or env.get("RESONTECH_GATEWAY_URL") or stored.get("url") or DEFAULT_URL)
    key = key or env.get("RESONTECH_API_KEY") or stored.get("key")
    return Config(urls=urls, key=key, retry_s=retry_seconds(retry_s, env, urls))
