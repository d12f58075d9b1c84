"""A cluster's dispatcher's own credentials: ``resontech dispatcher enroll`` writes them (as the
operator, with the kernel's credentials), ``resontech dispatcher run --credentials FILE`` connects
with them.

The file (JSON, owner-readable only) holds the cluster's name, the terms its nodes enroll under
(provider, pool, region, owner tenant) and the dispatcher's NATS user and password: a user of the
agents' account with exactly the agent permissions of the cluster's enrolled nodes, plus enrolling
new ones and asking about them (:func:`core.natsauth.dispatcher_permissions`). It reads no stream and
writes no kernel event; the password is shown nowhere else and stored only as a bcrypt hash.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from core.errors import ConfigError, InvalidInput
from core.files import write_private
from core.natsauth import AGENT_JS_API_PREFIX, dispatcher_user, inbox_prefix
from core.settings import Settings
from ops.dispatcher.fleet import Identity
from projections.providers import dispatcher_id
from schemas.values import Pool


class DispatcherCredentials(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What ``resontech dispatcher enroll`` writes."""

    cluster: str
    provider: str
    pool: Pool = "shared"
    region: str = ""
    owner_tenant: str | None = None
    nats_user: str
    nats_password: str

    def identity(self, version: str) -> Identity:
        """What the cluster's nodes register as."""
        return Identity(
            cluster=self.cluster,
            provider=self.provider,
            pool=self.pool,
            region=self.region,
            owner_tenant=self.owner_tenant,
            version=version,
        )

    def connection(self, settings: Settings) -> Settings:
        """``settings`` with this dispatcher's NATS user: its inbox, and the kernel's JetStream API as
        agents reach it."""
        return msgspec.structs.replace(
            settings,
            nats_creds=None,
            nats_user=self.nats_user,
            nats_password=self.nats_password,
            nats_inbox_prefix=inbox_prefix(dispatcher_id(self.cluster)),
            nats_js_api_prefix=AGENT_JS_API_PREFIX,
        )


def write(path: Path, credentials: DispatcherCredentials) -> None:
    """Write ``credentials`` to ``path`` whole, owner-readable only."""
    write_private(path, msgspec.json.format(msgspec.json.encode(credentials), indent=2) + b"\n")


def read(path: Path) -> DispatcherCredentials:
    """The credentials in ``path``.

    Raises:
        ConfigError: the file is missing, unreadable or not credentials ``dispatcher enroll`` wrote.
    """
    try:
        credentials = msgspec.json.decode(path.read_bytes(), type=DispatcherCredentials)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path} is not a dispatcher's credentials file: {exc}") from None
    try:
        user = dispatcher_user(credentials.cluster)
    except InvalidInput as exc:
        raise ConfigError(f"{path}: {exc.message}") from None
    if credentials.nats_user != user:
        raise ConfigError(
            f"{path}: user {credentials.nats_user!r} is not cluster {credentials.cluster}'s dispatcher"
        )
    return credentials
