"""Typed settings, read once at start-up from the environment (and a dev.env file, if given).

Every setting is ``RESONTECH_<NAME>``. A malformed value stops the program with one line that names
the setting (:class:`~core.errors.ConfigError`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import msgspec

from core.addresses import parse_networks
from core.errors import ConfigError, InvalidInput

PREFIX = "RESONTECH_"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings shared by every process.

    Attributes:
        nats_url: NATS server URL(s), comma-separated (default ``nats://127.0.0.1:4222``).
        nats_creds: path to a NATS credentials file, if the server requires one.
        nats_user / nats_password: user and password auth, if used instead.
        nats_inbox_prefix: the prefix of reply subjects (default ``_INBOX``); an enrolled agent's
            credentials only let it receive on ``_INBOX_<worker_id>.>``.
        nats_js_api_prefix: the JetStream API prefix (default ``$JS.API``); enrolled agents reach
            the kernel's JetStream through ``JS.KERNEL.API`` (see :mod:`core.natsauth`).
        stream_replicas: replicas of every stream (1 in dev, 3 on a production cluster).
        s3_endpoint: S3-compatible endpoint URL (default ``http://127.0.0.1:9000``).
        s3_access_key / s3_secret_key: object store credentials.
        s3_region: region name sent to the object store.
        data_dir: local state (dev stack, audit exports); default ``.resontech``.
        snapshot_every: a projection snapshots after this many events (default 10,000)...
        snapshot_interval_s: ...or this many seconds with new events (default 30).
        ack_timeout_s: how long an append waits for the server's acknowledgement (default 5).
        group_commit: appends to one stream waiting at the same moment go out as one atomic batch,
            stored with one write (default on; :mod:`core.log.group_commit`). Off only to measure
            the difference.
        replica_networks: the networks a replica's address must resolve into, comma-separated
            CIDRs (default empty: any address; loopback, unspecified, link-local and multicast
            addresses and the kernel's own services are refused all the same, and loopback is
            allowed only when a loopback network is listed: the dev stack sets
            ``127.0.0.0/8,::1/128``; :mod:`core.addresses`).
    """

    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds: str | None = None
    nats_user: str | None = None
    nats_password: str | None = None
    nats_inbox_prefix: str | None = None
    nats_js_api_prefix: str | None = None
    stream_replicas: int = 1
    s3_endpoint: str = "http://127.0.0.1:9000"
    s3_access_key: str = "resontech"
    s3_secret_key: str = "resontech-dev-secret"
    s3_region: str = "us-east-1"
    data_dir: str = ".resontech"
    snapshot_every: int = 10_000
    snapshot_interval_s: float = 30.0
    ack_timeout_s: float = 5.0
    group_commit: bool = True
    replica_networks: str = ""


def read_env_file(path: Path) -> dict[str, str]:
    """Parse ``KEY=VALUE`` lines (``#`` comments, optional quotes) of a dev.env file."""
    out: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        out[key.strip().removeprefix("export ").strip()] = value.strip().strip("'\"")
    return out


def load(env: Mapping[str, str] | None = None, env_file: Path | None = None) -> Settings:
    """Build :class:`Settings` from ``env`` (default ``os.environ``), over an optional env file.

    Values in the environment win over the file.
    """
    values: dict[str, str] = {}
    if env_file is not None and env_file.exists():
        values.update(read_env_file(env_file))
    values.update(os.environ if env is None else env)
    fields = {f.name: f for f in msgspec.structs.fields(Settings)}
    raw: dict[str, object] = {}
    for name, field in fields.items():
        key = PREFIX + name.upper()
        if key not in values or values[key] == "":
            continue
        value = values[key]
        try:
            raw[name] = msgspec.convert(value, field.type, strict=False)
        except msgspec.ValidationError:
            raise ConfigError(f"{key}={value!r} is not a valid {_type_name(field.type)}") from None
    settings = msgspec.convert(raw, Settings)
    if settings.stream_replicas not in (1, 3, 5):
        raise ConfigError(f"{PREFIX}STREAM_REPLICAS must be 1, 3 or 5, got {settings.stream_replicas}")
    if not settings.nats_url.startswith(("nats://", "tls://", "ws://", "wss://")):
        raise ConfigError(f"{PREFIX}NATS_URL must start with nats://, tls://, ws:// or wss://")
    try:
        parse_networks(settings.replica_networks)
    except InvalidInput as exc:
        raise ConfigError(f"{PREFIX}REPLICA_NETWORKS: {exc.message}") from None
    return settings


def _type_name(tp: object) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def version() -> str:
    """The installed ``resontech`` version, or ``dev`` when run from a source tree (what an agent and
    a dispatcher register their workers with)."""
    try:
        return metadata.version("resontech")
    except metadata.PackageNotFoundError:
        return "dev"
