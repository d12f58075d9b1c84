"""Where the SDK connects and with which key: arguments, the environment, or `resontech login`'s file."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CREDENTIALS = (
    Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "resontech" / "credentials.json"
)
"""Where `resontech login` keeps the gateway URL and key (mode 0600)."""


@dataclass(frozen=True)
class Config:
    url: str
    key: str | None


def resolve(url: str | None = None, key: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Where to connect and with which key: arguments, then ``RESONTECH_GATEWAY_URL`` /
    ``RESONTECH_API_KEY``, then the file `resontech login` wrote."""
    env = os.environ if env is None else env
    stored: dict[str, str] = {}
    if CREDENTIALS.exists():
        with contextlib.suppress(ValueError, OSError):
            stored = json.loads(CREDENTIALS.read_text())
    url = url or env.get("RESONTECH_GATEWAY_URL") or stored.get("url") or "http://127.0.0.1:8080"
    key = key or env.get("RESONTECH_API_KEY") or stored.get("key")
    return Config(url=url.rstrip("/"), key=key)
