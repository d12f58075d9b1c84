"""Events of the PROVIDERS stream: ``provider.<provider>.<event>``.

A provider account is separate from a tenant: it owns hosts (workers), not jobs. Its people use API
keys; its agents enroll with one-time enrollment tokens and receive NATS credentials of their own.
A token for a ``managed`` or ``private`` pool is usable only once approved
(``EnrollmentTokenApproved``): by an admin of the owner tenant for ``private``, by the operator for
``managed``; a provider never approves its own.
The NATS server's list of agent users is derived from these events (``AgentEnrolled`` adds a user,
``AgentCredentialsRevoked`` removes it), so no secret is stored anywhere but as a bcrypt hash.
"""

from __future__ import annotations

from schemas._base import Event, Fields, Value
from schemas.values import KeyIssue, KeyRevocation


class ProviderCreated(Event, tag="provider.created", frozen=True, kw_only=True):
    """A GPU provider's account was created (by the operator)."""

    display_name: str
    created_by: str = ""


class ProviderKeyIssued(Event, KeyIssue, tag="provider.api_key_issued", frozen=True, kw_only=True):
    """An API key of the provider's account was issued."""

    label: str = ""
    issued_by: str = ""


class ProviderKeyRevoked(Event, KeyRevocation, tag="provider.api_key_revoked", frozen=True, kw_only=True):
    """An API key of the provider's account stops working."""


class TokenTerms(Fields, frozen=True, kw_only=True):
    """The terms of a one-time enrollment token. Only its SHA-256 is stored.

    Attributes:
        expires_ns: the token is refused after this time (Unix ns).
        pool / region / owner_tenant: what an agent enrolled with it is registered as
            (``owner_tenant``: the organisation of a managed or private pool worker).
    """

    token_id: str
    token_sha256: str
    expires_ns: int
    pool: str = "shared"
    region: str = ""
    owner_tenant: str | None = None
    label: str = ""


class EnrollmentTokenIssued(
    Event, TokenTerms, tag="provider.enrollment_token_issued", frozen=True, kw_only=True
):
    """A one-time token an agent presents to enroll."""

    issued_by: str = ""


class EnrollmentTokenRevoked(Event, tag="provider.enrollment_token_revoked", frozen=True, kw_only=True):
    """An unused enrollment token stops working: revoked by its provider, or refused (denied) by
    whoever had to approve it (``revoked_by``: ``tenant:<id>`` or ``operator``)."""

    token_id: str
    revoked_by: str = ""


class EnrollmentTokenApproved(Event, tag="provider.enrollment_token_approved", frozen=True, kw_only=True):
    """A managed or private pool token may now enroll an agent.

    Attributes:
        approved_by: who consented: ``tenant:<owner tenant>`` (an admin of it) for a private pool,
            ``operator`` for a managed one.
    """

    token_id: str
    approved_by: str


class AgentEnrolled(Event, tag="provider.agent_enrolled", frozen=True, kw_only=True):
    """An agent enrolled with a token (which is used up) and received NATS credentials for
    ``worker_id`` alone.

    Attributes:
        nats_user: the NATS user of those credentials.
        nats_password_bcrypt: the bcrypt hash of its password, as the NATS server's configuration
            takes it (the password itself was shown to the agent once and is stored nowhere).
    """

    token_id: str
    worker_id: str
    hostname: str = ""
    nats_user: str = ""
    nats_password_bcrypt: str = ""


class AgentCredentialsRevoked(Event, tag="provider.agent_credentials_revoked", frozen=True, kw_only=True):
    """The NATS credentials of one enrolled agent stop working."""

    worker_id: str
    revoked_by: str = ""


class ClusterEnrolled(Event, tag="provider.cluster_enrolled", frozen=True, kw_only=True):
    """The operator enrolled a Kubernetes cluster's dispatcher (``resontech dispatcher enroll``): its
    own NATS user, with exactly the agent permissions of the cluster's node-workers (which it enrolls
    through the intake, under ``token_id``'s terms) and nothing else. Enrolling a cluster again
    replaces its credentials.

    Attributes:
        cluster: the cluster's name; its node-workers are ``kernel-<cluster>-<node>``.
        token_id: the provider's token whose pool, region and owner tenant every node enrolls with.
        nats_user / nats_password_bcrypt: as :class:`AgentEnrolled`'s.
    """

    cluster: str
    token_id: str
    nats_user: str
    nats_password_bcrypt: str
    enrolled_by: str = ""


class ClusterCredentialsRevoked(Event, tag="provider.cluster_credentials_revoked", frozen=True, kw_only=True):
    """The NATS credentials of a cluster's dispatcher stop working (its nodes keep their enrollment,
    and fall silent)."""

    cluster: str
    revoked_by: str = ""


class HeldAssignment(Value, frozen=True, kw_only=True):
    """A current assignment of one of a cluster's node-workers, as the kernel holds it.

    Attributes:
        kind: ``job`` or ``endpoint``.
    """

    assignment_id: str
    tenant: str
    work_id: str
    kind: str
    worker_id: str


class ClusterFacts(Value, frozen=True, kw_only=True):
    """The kernel's answer to a dispatcher's question (``kernel.cluster.<dispatcher>``): its nodes
    that are enrolled, and their current assignments, as of the log's ``seq`` positions.

    Attributes:
        token_id: the token its new nodes enroll under (:class:`ClusterEnrolled`).
        enrolled: node-worker ids enrolled under the cluster's token, live.
        assignments: the current assignments of those workers (jobs not ended, endpoints not deleted).
        error: why there is no answer (the asker is no live cluster's dispatcher); empty otherwise.
    """

    token_id: str = ""
    enrolled: list[str] = []
    assignments: list[HeldAssignment] = []
    error: str = ""


ProviderEvent = (
    ProviderCreated
    | ProviderKeyIssued
    | ProviderKeyRevoked
    | EnrollmentTokenIssued
    | EnrollmentTokenRevoked
    | EnrollmentTokenApproved
    | AgentEnrolled
    | AgentCredentialsRevoked
    | ClusterEnrolled
    | ClusterCredentialsRevoked
)
