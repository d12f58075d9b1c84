"""Unit tests of enrollment approval in the providers projection: a managed or private pool token is
pending until approved, a refusal is a revocation that records who, and :func:`enrollment_of` gives a
worker's identity as the kernel recorded it at enrollment (O(1), through the live-enrollment index)."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from core.streams import provider_subject
from projections import PROVIDERS
from projections.base import canonical_json, state_hash
from projections.providers import (
    Enrollment,
    ProvidersState,
    enrolled_provider,
    enrollment_of,
    token_status,
)
from schemas._base import Event
from schemas.envelope import Recorded
from schemas.providers import (
    AgentCredentialsRevoked,
    AgentEnrolled,
    EnrollmentTokenApproved,
    EnrollmentTokenIssued,
    EnrollmentTokenRevoked,
    ProviderCreated,
)

S = 1_000_000_000
EXPIRES = 3600 * S


class Log:
    """Numbers PROVIDERS records and folds them, as the log and the projection runner would."""

    def __init__(self) -> None:
        self.state = PROVIDERS.initial()
        self.records: list[Recorded[Any]] = []

    def __call__(self, provider: str, event: Event, t_s: float = 0.0) -> ProvidersState:
        record: Recorded[Any] = Recorded(
            stream="PROVIDERS",
            seq=len(self.records) + 1,
            subject=provider_subject(provider, event),
            time_ns=round(t_s * S),
            msg_id=f"m{len(self.records) + 1}",
            event=event,
        )
        self.records.append(record)
        self.state = PROVIDERS.evolve(self.state, record)
        return self.state

    def provider(self, name: str) -> None:
        self(name, ProviderCreated(display_name=name))

    def token(self, provider: str, token_id: str, pool: str = "shared", owner: str | None = None) -> None:
        self(
            provider,
            EnrollmentTokenIssued(
                token_id=token_id,
                token_sha256="0" * 64,
                expires_ns=EXPIRES,
                pool=pool,
                region="eu-north",
                owner_tenant=owner,
            ),
        )

    def enroll(self, provider: str, token_id: str, worker_id: str, t_s: float = 1.0) -> None:
        self(
            provider,
            AgentEnrolled(token_id=token_id, worker_id=worker_id, nats_user=f"agent-{worker_id}"),
            t_s,
        )


@pytest.fixture
def log() -> Log:
    log = Log()
    log.provider("gpuco")
    return log


def test_a_shared_pool_enrollment_is_the_tokens_identity(log: Log) -> None:
    log.token("gpuco", "t1")
    assert enrollment_of(log.state, "w1") is None
    log.enroll("gpuco", "t1", "w1")
    assert enrollment_of(log.state, "w1") == Enrollment(
        provider="gpuco", worker_id="w1", token_id="t1", pool="shared", region="eu-north", owner_tenant=None
    )
    assert enrolled_provider(log.state, "w1") == "gpuco"
    assert enrollment_of(log.state, "w-other") is None


@pytest.mark.parametrize("pool", ["managed", "private"])
def test_a_managed_or_private_token_is_pending_until_approved(log: Log, pool: str) -> None:
    log.token("gpuco", "t1", pool, "acme")
    token = log.state.providers["gpuco"].tokens["t1"]
    assert token.awaiting_approval and token_status(token, 0) == "pending_approval"
    approver = "tenant:acme" if pool == "private" else "operator"
    log("gpuco", EnrollmentTokenApproved(token_id="t1", approved_by=approver), t_s=5)
    token = log.state.providers["gpuco"].tokens["t1"]
    assert (token.approved_by, token.decided_ns, token_status(token, 0)) == (approver, 5 * S, "active")
    assert token_status(token, EXPIRES) == "expired"
    log.enroll("gpuco", "t1", "w1", t_s=6)
    assert enrollment_of(log.state, "w1") == Enrollment(
        provider="gpuco", worker_id="w1", token_id="t1", pool=pool, region="eu-north", owner_tenant="acme"
    )
    assert token_status(log.state.providers["gpuco"].tokens["t1"], 0) == "used"


def test_a_refusal_is_a_revocation_that_records_who_and_wins_over_a_later_approval(log: Log) -> None:
    log.token("gpuco", "t1", "private", "acme")
    log("gpuco", EnrollmentTokenRevoked(token_id="t1", revoked_by="tenant:acme"), t_s=3)
    log("gpuco", EnrollmentTokenApproved(token_id="t1", approved_by="tenant:acme"), t_s=4)
    log("gpuco", EnrollmentTokenRevoked(token_id="t1", revoked_by="provider:gpuco"), t_s=5)
    token = log.state.providers["gpuco"].tokens["t1"]
    assert (token.revoked, token.revoked_by, token.approved_by, token.decided_ns) == (
        True,
        "tenant:acme",
        None,
        3 * S,
    )
    assert token_status(token, 0) == "revoked"


def test_approving_a_shared_or_unknown_token_changes_nothing(log: Log) -> None:
    log.token("gpuco", "t1")
    before = log.state.providers["gpuco"].tokens
    log("gpuco", EnrollmentTokenApproved(token_id="t1", approved_by="operator"))
    log("gpuco", EnrollmentTokenApproved(token_id="nope", approved_by="operator"))
    log("nobody", EnrollmentTokenApproved(token_id="t1", approved_by="operator"))
    assert log.state.providers["gpuco"].tokens == before
    assert "nobody" not in log.state.providers


def test_an_enrollment_with_an_unapproved_token_vouches_for_nothing(log: Log) -> None:
    """An enrollment recorded before approval existed (the gateway now refuses it) gives no identity:
    the owner tenant never consented to that host."""
    log.token("gpuco", "t1", "private", "acme")
    log.enroll("gpuco", "t1", "w1")
    assert enrolled_provider(log.state, "w1") == "gpuco"
    assert enrollment_of(log.state, "w1") is None
    log.enroll("gpuco", "never-issued", "w2")
    assert enrollment_of(log.state, "w2") is None


def test_a_revoked_agent_has_no_enrollment_until_it_enrolls_anew(log: Log) -> None:
    log.token("gpuco", "t1")
    log.token("gpuco", "t2", "managed", "acme")
    log.enroll("gpuco", "t1", "w1")
    log("gpuco", AgentCredentialsRevoked(worker_id="w1", revoked_by="provider:gpuco"))
    assert enrollment_of(log.state, "w1") is None and enrolled_provider(log.state, "w1") is None
    assert "w1" not in log.state.enrolled
    log("gpuco", EnrollmentTokenApproved(token_id="t2", approved_by="operator"))
    log.enroll("gpuco", "t2", "w1")
    found = enrollment_of(log.state, "w1")
    assert found is not None and (found.token_id, found.pool, found.owner_tenant) == ("t2", "managed", "acme")


def test_a_revocation_by_another_provider_leaves_the_enrollment_alone(log: Log) -> None:
    log.provider("other")
    log.token("gpuco", "t1")
    log.enroll("gpuco", "t1", "w1")
    log("other", AgentCredentialsRevoked(worker_id="w1", revoked_by="provider:other"))
    assert enrolled_provider(log.state, "w1") == "gpuco"


def test_the_index_falls_back_when_a_log_holds_one_worker_under_two_providers(log: Log) -> None:
    """The gateway enrolls a worker id once; a log that says otherwise still folds to the truth."""
    log.provider("other")
    log.token("gpuco", "t1")
    log.token("other", "t2")
    log.enroll("gpuco", "t1", "w1")
    log.enroll("other", "t2", "w1")
    log("other", AgentCredentialsRevoked(worker_id="w1"))
    found = enrollment_of(log.state, "w1")
    assert found is not None and (found.provider, found.token_id) == ("gpuco", "t1")


def _scan(state: ProvidersState) -> dict[str, set[str]]:
    """Worker id -> the providers holding it live, by a full scan (what the index stands for)."""
    live: dict[str, set[str]] = {}
    for record in state.providers.values():
        for agent in record.agents.values():
            if not agent.revoked:
                live.setdefault(agent.worker_id, set()).add(record.provider)
    return live


@pytest.mark.parametrize("seed", range(20))
def test_the_index_agrees_with_a_full_scan_and_the_state_replays(seed: int) -> None:
    rng = random.Random(seed)
    log = Log()
    providers, workers = ["p1", "p2", "p3"], [f"w{i}" for i in range(6)]
    for provider in providers:
        log.provider(provider)
    for i in range(120):
        provider, worker = rng.choice(providers), rng.choice(workers)
        pool = rng.choice(["shared", "managed", "private"])
        match rng.randrange(5):
            case 0 | 1:
                log.token(provider, f"t{i}", pool, None if pool == "shared" else "acme")
                if rng.random() < 0.6:
                    log(provider, EnrollmentTokenApproved(token_id=f"t{i}", approved_by="x"))
                log.enroll(provider, f"t{i}", worker, t_s=i)
            case 2 | 3:
                log(provider, AgentCredentialsRevoked(worker_id=worker))
            case 4:
                log(provider, EnrollmentTokenRevoked(token_id=f"t{rng.randrange(i + 1)}"))
        live = _scan(log.state)
        assert set(log.state.enrolled) == set(live)
        assert all(log.state.enrolled[w] in holders for w, holders in live.items())
        for worker_id in workers:
            found = enrollment_of(log.state, worker_id)
            if found is not None:
                token = log.state.providers[found.provider].tokens[found.token_id]
                assert not token.awaiting_approval and found.pool == token.pool
    decoded = msgspec.json.decode(canonical_json(log.state), type=ProvidersState)
    assert decoded == log.state
    assert state_hash(PROVIDERS.fold(log.records)) == state_hash(log.state)
    doubled = PROVIDERS.fold(r for record in log.records for r in (record, record))
    assert state_hash(doubled) == state_hash(log.state)
