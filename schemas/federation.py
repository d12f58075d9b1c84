"""Events of the FEDERATION stream: which federation service instance runs each federated job's FL
server (``federation.<tenant>.<job_id>.<event>``), and that instance's liveness
(``federation.<instance>.beat``).

Every event of the stream is appended against the stream's last sequence as its writer has read it
(one compare-and-set over ``federation.>``), so that no instance claims, renews or provisions from a
stale view: see :mod:`core.federation_claims`.

An *incarnation* is one run of an instance (a random id drawn at start-up): a service restarted
under the same instance name is another incarnation, and must wait for the claims of the last one to
lapse like any other instance.
"""

from __future__ import annotations

from schemas._base import Event


class FederationBeat(Event, tag="federation.beat", frozen=True, kw_only=True):
    """An instance is alive and has read the stream up to the sequence before this one: it renews
    every claim it holds. The instance is the subject's second token.

    Attributes:
        incarnation: the instance's current run.
        lease_ms: how long after its latest event another instance may take its jobs over.
    """

    incarnation: str
    lease_ms: int


class FederationClaimed(Event, tag="federation.claimed", frozen=True, kw_only=True):
    """An instance claimed a federated job: it alone runs the job's FL server, for as long as it
    keeps beating.

    Attributes:
        instance: the claiming instance's name.
        incarnation: its current run.
        term: the job's claim count (1 for the first claim); a claim whose term is not the last
            one plus one is stale, and ignored.
        lease_ms: as in :class:`FederationBeat`.
        took_over_from: the instance whose claim lapsed, if any (empty for a first claim or after
            a release).
    """

    instance: str
    incarnation: str
    term: int
    lease_ms: int
    took_over_from: str = ""


class FederationProvisioned(Event, tag="federation.provisioned", frozen=True, kw_only=True):
    """The holder of a job's claim provisioned the job's federation and stored its server side (the
    certificates, the server's and the kernel's startup kits) in the kernel's kit bucket, before any
    client kit is handed out: whoever holds the claim next serves that same federation, at the same
    address, so that clients reconnect by themselves.

    Attributes:
        instance / incarnation / term: the claim it belongs to (ignored unless it is the current one).
        archive: the object key of the federation's ZIP in the kit bucket.
        server: ``host:port`` the clients dial.
    """

    instance: str
    incarnation: str
    term: int
    archive: str
    server: str


class FederationReleased(Event, tag="federation.released", frozen=True, kw_only=True):
    """The holder gave its claim up (it is stopping): another instance may claim the job at once.

    Attributes:
        instance / incarnation / term: the claim given up (ignored unless it is the current one).
        reason: why.
    """

    instance: str
    incarnation: str
    term: int
    reason: str = ""


FederationEvent = FederationBeat | FederationClaimed | FederationProvisioned | FederationReleased
