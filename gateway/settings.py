"""The gateway's typed settings, read once at start-up from ``RESONTECH_GATEWAY_*``.

NATS and object-store settings are the shared :class:`core.settings.Settings`. A malformed value
stops the gateway with one line that names the setting (:class:`~core.errors.ConfigError`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import msgspec

from core.errors import ConfigError

PREFIX = "RESONTECH_GATEWAY_"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of one gateway process.

    Attributes:
        host / port: where it listens (default ``127.0.0.1:8080``).
        public_url: the URL clients use (default ``http://<host>:<port>``).
        operator_key_sha256: SHA-256 (hex) of the operator's API key; without it no operator route
            can be used (``resontech up`` generates a key and writes it to ``dev.env``).
        max_body_bytes: larger request bodies are refused with 413 (default 1 MiB).
        max_inference_body_bytes: the same for the OpenAI-compatible routes, whose bodies carry
            prompts and embedding inputs (default 16 MiB).
        workers: server worker processes (default 1).
        feed_queue: messages a feed client may fall behind by before it is closed as too slow
            (default 1,000; see :mod:`gateway.feed`).
        feed_ping_s: a feed client idle this many seconds gets a ``feed.ping`` (default 20).
        feed_telemetry_s: at most one ``telemetry`` message per worker per this many seconds
            (default 5).
        agent_nats_url: the NATS URL(s) handed to enrolling agents (default: the gateway's own
            ``RESONTECH_NATS_URL``; set it when agents reach NATS at another address).
        token_tick_s: how often the tokens counted per replica are appended as usage ticks
            (default 10 s; see :mod:`gateway.token_meter`).
        header_timeout_s: a connection that has not sent a whole request head this long after it
            opened, or after its last response (keep-alive), is closed (default 5, 1 to 60).
        max_connections: connections one worker serves at once (granian's backpressure; default
            8,192, at most what the open-file limit allows); more wait in the backlog.
        backlog: connections the kernel holds waiting to be accepted (default 4,096).
        body_timeout_s: a request whose next body chunk takes longer is ended (default 30).
        max_requests_per_client / max_requests_per_key: HTTP requests in flight from one IP
            address / for one API key; more are answered 429 at once (defaults 1,024 / 512).
        max_feeds_per_client / max_feeds_per_key: open feed WebSockets from one IP address / for
            one API key; more are refused (defaults 256 / 32). See :mod:`gateway.limits`.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str = ""
    operator_key_sha256: str = ""
    max_body_bytes: int = 1_048_576
    max_inference_body_bytes: int = 16_777_216
    workers: int = 1
    feed_queue: int = 1000
    feed_ping_s: float = 20.0
    feed_telemetry_s: float = 5.0
    agent_nats_url: str = ""
    token_tick_s: float = 10.0
    header_timeout_s: float = 5.0
    max_connections: int = 8192
    backlog: int = 4096
    body_timeout_s: float = 30.0
    max_requests_per_client: int = 1024
    max_requests_per_key: int = 512
    max_feeds_per_client: int = 256
    max_feeds_per_key: int = 32

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"


def load_gateway_settings(env: Mapping[str, str] | None = None) -> GatewaySettings:
    """:class:`GatewaySettings` from ``env`` (default ``os.environ``)."""
    values = os.environ if env is None else env
    raw: dict[str, object] = {}
    for field in msgspec.structs.fields(GatewaySettings):
        key = PREFIX + field.name.upper()
        if values.get(key, "") == "":
            continue
        try:
            raw[field.name] = msgspec.convert(values[key], field.type, strict=False)
        except msgspec.ValidationError:
            raise ConfigError(f"{key}={values[key]!r} is not a valid {field.type}") from None
    settings = msgspec.convert(raw, GatewaySettings)
    if settings.operator_key_sha256 and not _SHA256.match(settings.operator_key_sha256):
        raise ConfigError(f"{PREFIX}OPERATOR_KEY_SHA256 must be 64 lowercase hex characters")
    if not 0 < settings.port < 65536:
        raise ConfigError(f"{PREFIX}PORT must be 1..65535, got {settings.port}")
    if settings.max_body_bytes < 1024:
        raise ConfigError(f"{PREFIX}MAX_BODY_BYTES must be at least 1024")
    if settings.max_inference_body_bytes < 1024:
        raise ConfigError(f"{PREFIX}MAX_INFERENCE_BODY_BYTES must be at least 1024")
    if settings.feed_queue < 1 or settings.feed_ping_s <= 0 or settings.feed_telemetry_s < 0:
        raise ConfigError(f"{PREFIX}FEED_QUEUE must be >= 1, FEED_PING_S > 0 and FEED_TELEMETRY_S >= 0")
    if settings.token_tick_s <= 0:
        raise ConfigError(f"{PREFIX}TOKEN_TICK_S must be > 0")
    if not 1.0 <= settings.header_timeout_s <= 60.0 or not 0 < settings.body_timeout_s <= 3600:
        raise ConfigError(f"{PREFIX}HEADER_TIMEOUT_S must be 1..60 and BODY_TIMEOUT_S 0..3600 (seconds)")
    caps = (
        settings.max_connections,
        settings.backlog,
        settings.max_requests_per_client,
        settings.max_requests_per_key,
        settings.max_feeds_per_client,
        settings.max_feeds_per_key,
    )
    if not all(1 <= n <= 1_000_000 for n in caps):
        raise ConfigError(f"{PREFIX}MAX_* and BACKLOG must be 1..1,000,000")
    return settings
