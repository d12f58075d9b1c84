"""Provider accounts, their keys, enrollment tokens and agents, and agent enrollment: keys and tokens
shown once and stored hashed, one-time tokens, scoping (another provider's things are not found),
bad input refused with nothing appended, and the approval of managed and private pool tokens (only
the owner tenant's admins put a host into its private pool, only the operator into a managed one, and
a provider learns nothing of which tenant ids exist)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from typing import Any

import bcrypt
import pytest

from core.log import EventLog
from core.streams import provider_subject
from projections import PROVIDERS
from projections.providers import enrollment_of
from schemas.providers import (
    AgentCredentialsRevoked,
    AgentEnrolled,
    EnrollmentTokenApproved,
    EnrollmentTokenIssued,
    EnrollmentTokenRevoked,
)
from tests.support import of, records
from tests.support.accounts import provider, token
from tests.support.gateway import Api


async def enroll(api: Api, value: str, worker_id: str | None = None) -> Any:
    body = {"token": value, "worker_id": worker_id or f"w-{secrets.token_hex(6)}", "hostname": "gpu-1"}
    return await api.request("POST", "/v1/agents/enroll", json=body)


async def test_operator_creates_a_provider_whose_key_works_and_is_stored_hashed(
    api: Api, log: EventLog
) -> None:
    name, key = await provider(api, "gpuco")
    me = (await api.request("GET", "/v1/me", key)).json()
    assert (me["kind"], me["account"]) == ("provider", "gpuco")
    got = await api.request("GET", "/v1/providers/gpuco", key)
    assert got.status_code == 200
    assert got.json()["display_name"] == "GPU Co" and got.json()["agents"] == 0
    listed = await api.request("GET", "/v1/providers", api.operator_key)
    assert [p["provider"] for p in listed.json()] == [name]
    stored = await records(log, "PROVIDERS")
    assert stored[1].event.key_sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert all(key not in repr(r.event) for r in stored)
    again = await api.request(
        "POST", "/v1/providers", api.operator_key, json={"provider": "gpuco", "display_name": "x"}
    )
    assert again.status_code == 409 and "exists" in again.json()["error"]["message"]


async def test_provider_keys_are_issued_listed_and_revoked(api: Api) -> None:
    name, key = await provider(api)
    second = await api.request("POST", f"/v1/providers/{name}/keys", key, json={"label": "ci"})
    assert second.status_code == 201
    new_key, new_id = second.json()["key"], second.json()["key_id"]
    keys = (await api.request("GET", f"/v1/providers/{name}/keys", key)).json()
    assert [k["label"] for k in keys] == ["first key", "ci"] and all("key" not in k for k in keys)
    assert (await api.request("DELETE", f"/v1/providers/{name}/keys/{new_id}", key)).status_code == 204
    refused = await api.request("GET", f"/v1/providers/{name}", new_key)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "key_revoked"
    assert (await api.request("DELETE", f"/v1/providers/{name}/keys/nope", key)).status_code == 404


async def test_enrollment_gives_credentials_once_and_uses_the_token_up(api: Api, log: EventLog) -> None:
    name, key = await provider(api)
    issued = await token(api, name, key, region="eu-north", label="rack 4")
    assert issued["token"].startswith("rte_") and issued["pool"] == "shared"
    worker = f"w-{secrets.token_hex(6)}"
    response = await enroll(api, issued["token"], worker)
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["worker_id"], body["provider"], body["region"]) == (worker, name, "eu-north")
    nats = body["nats"]
    assert (nats["user"], nats["inbox_prefix"], nats["js_api_prefix"]) == (
        f"agent-{worker}",
        f"_INBOX_{worker}",
        "JS.KERNEL.API",
    )
    assert nats["url"] == api.kernel.settings.nats_url
    [enrolled] = of(await records(log, "PROVIDERS"), AgentEnrolled)
    assert enrolled.worker_id == worker and enrolled.token_id == issued["token_id"]
    assert bcrypt.checkpw(nats["password"].encode(), enrolled.nats_password_bcrypt.encode())
    stored = await records(log, "PROVIDERS")
    assert all(nats["password"] not in repr(r.event) and issued["token"] not in repr(r.event) for r in stored)
    reused = await enroll(api, issued["token"])
    assert reused.status_code == 409
    assert reused.json()["error"]["code"] == "token_used" and worker in reused.json()["error"]["message"]
    tokens = (await api.request("GET", f"/v1/providers/{name}/enrollment-tokens", key)).json()
    assert [(t["status"], t["used_by"]) for t in tokens] == [("used", worker)]
    agents = (await api.request("GET", f"/v1/providers/{name}/agents", key)).json()
    assert [(a["worker_id"], a["hostname"], a["revoked"]) for a in agents] == [(worker, "gpu-1", False)]
    assert (await api.request("GET", f"/v1/providers/{name}", key)).json()["agents"] == 1


async def test_two_enrollments_racing_with_one_token_one_wins(api: Api, log: EventLog) -> None:
    name, key = await provider(api)
    value = (await token(api, name, key))["token"]
    responses = await asyncio.gather(*(enroll(api, value) for _ in range(4)))
    assert sorted(r.status_code for r in responses) == [201, 409, 409, 409]
    assert len(of(await records(log, "PROVIDERS"), AgentEnrolled)) == 1


async def test_expired_revoked_unknown_and_malformed_tokens_are_refused(api: Api, log: EventLog) -> None:
    name, key = await provider(api)
    expired = f"rte_{'e' * 12}_{secrets.token_urlsafe(32)}"
    event = EnrollmentTokenIssued(
        token_id="e" * 12,
        token_sha256=hashlib.sha256(expired.encode()).hexdigest(),
        expires_ns=time.time_ns() - 1,
    )
    await api.kernel.append(provider_subject(name, event), event, visible_in=PROVIDERS)
    response = await enroll(api, expired)
    assert response.status_code == 401 and response.json()["error"]["code"] == "token_expired"
    assert "ask for a new one" in response.json()["error"]["message"]
    revoked = await token(api, name, key)
    path = f"/v1/providers/{name}/enrollment-tokens/{revoked['token_id']}"
    assert (await api.request("DELETE", path, key)).status_code == 204
    assert (await enroll(api, revoked["token"])).json()["error"]["code"] == "token_revoked"
    statuses = {
        t["token_id"]: t["status"] for t in (await api.request("GET", path.rsplit("/", 1)[0], key)).json()
    }
    assert statuses == {"e" * 12: "expired", revoked["token_id"]: "revoked"}
    good = await token(api, name, key)
    forged = good["token"][:-4] + "AAAA"
    for bad, code in ((forged, "invalid_token"), ("rte_nope", "invalid_token"), ("x" * 50, "invalid_token")):
        response = await enroll(api, bad)
        assert response.status_code == 401 and response.json()["error"]["code"] == code, bad
    assert not of(await records(log, "PROVIDERS"), AgentEnrolled)


async def test_a_worker_enrolls_once_and_a_used_token_cannot_be_revoked(api: Api) -> None:
    name, key = await provider(api)
    first, second = await token(api, name, key), await token(api, name, key)
    worker = f"w-{secrets.token_hex(6)}"
    assert (await enroll(api, first["token"], worker)).status_code == 201
    again = await enroll(api, second["token"], worker)
    assert again.status_code == 409 and again.json()["error"]["code"] == "worker_enrolled"
    used = await api.request("DELETE", f"/v1/providers/{name}/enrollment-tokens/{first['token_id']}", key)
    assert used.status_code == 409 and f"agents/{worker}" in used.json()["error"]["message"]


async def test_revoking_an_agent_records_it_once(api: Api, log: EventLog) -> None:
    name, key = await provider(api)
    worker = (await enroll(api, (await token(api, name, key))["token"])).json()["worker_id"]
    for _ in range(2):
        assert (await api.request("DELETE", f"/v1/providers/{name}/agents/{worker}", key)).status_code == 204
    assert len(of(await records(log, "PROVIDERS"), AgentCredentialsRevoked)) == 1
    agents = (await api.request("GET", f"/v1/providers/{name}/agents", key)).json()
    assert agents[0]["revoked"] is True
    assert (await api.request("DELETE", f"/v1/providers/{name}/agents/w-nope", key)).status_code == 404
    # its worker id is free again: the host may enroll anew with a fresh token
    assert (await enroll(api, (await token(api, name, key))["token"], worker)).status_code == 201


@pytest.mark.parametrize(
    ("body", "fix"),
    [
        ({"pool": "managed"}, "set owner_tenant"),
        ({"pool": "private"}, "set owner_tenant"),
        ({"owner_tenant": "acme"}, "only for managed and private"),
        ({"expires_in_s": 5}, "expires_in_s"),
        ({"expires_in_s": 10**9}, "expires_in_s"),
        ({"pool": "gold"}, "pool"),
        ({"region": "eu west"}, "region"),
        ({"nope": 1}, "nope"),
    ],
)
async def test_bad_token_requests_say_what_to_fix_and_append_nothing(
    api: Api, log: EventLog, body: dict[str, Any], fix: str
) -> None:
    name, key = await provider(api)
    before = await log.last_seq("PROVIDERS")
    response = await api.request("POST", f"/v1/providers/{name}/enrollment-tokens", key, json=body)
    assert response.status_code == 400, response.text
    assert fix in response.json()["error"]["message"]
    assert await log.last_seq("PROVIDERS") == before


async def test_bad_enrollments_are_refused_with_nothing_appended(api: Api, log: EventLog) -> None:
    name, key = await provider(api)
    value = (await token(api, name, key))["token"]
    before = await log.last_seq("PROVIDERS")
    for body in (
        {"token": value},
        {"token": value, "worker_id": "has.dot"},
        {"token": value, "worker_id": "w-1", "extra": 1},
        {"token": "", "worker_id": "w-1"},
    ):
        response = await api.request("POST", "/v1/agents/enroll", json=body)
        assert response.status_code == 400, (body, response.text)
    assert await log.last_seq("PROVIDERS") == before


async def test_every_route_needs_a_key_and_other_providers_things_are_not_found(api: Api) -> None:
    _, a_key = await provider(api)
    b, b_key = await provider(api)
    tenant, tenant_key = await api.tenant()
    b_token = await token(api, b, b_key)
    worker = (await enroll(api, (await token(api, b, b_key))["token"])).json()["worker_id"]
    key_id = (await api.request("GET", f"/v1/providers/{b}/keys", b_key)).json()[0]["key_id"]
    routes = [
        ("GET", f"/v1/providers/{b}", None),
        ("GET", f"/v1/providers/{b}/keys", None),
        ("POST", f"/v1/providers/{b}/keys", {}),
        ("DELETE", f"/v1/providers/{b}/keys/{key_id}", None),
        ("GET", f"/v1/providers/{b}/enrollment-tokens", None),
        ("POST", f"/v1/providers/{b}/enrollment-tokens", {}),
        ("DELETE", f"/v1/providers/{b}/enrollment-tokens/{b_token['token_id']}", None),
        ("GET", f"/v1/providers/{b}/agents", None),
        ("DELETE", f"/v1/providers/{b}/agents/{worker}", None),
    ]
    for method, path, body in routes:
        kwargs = {"json": body} if body is not None else {}
        assert (await api.request(method, path, **kwargs)).status_code == 401, path
        denied = await api.request(method, path, a_key, **kwargs)
        assert denied.status_code == 404, (path, denied.text)
        assert denied.json()["error"]["code"] == "not_found"
        assert (await api.request(method, path, tenant_key, **kwargs)).status_code == 403, path
    for method, path in (("GET", "/v1/providers"), ("POST", "/v1/providers")):
        assert (await api.request(method, path, a_key, json={})).status_code == 403
    assert (await api.request("GET", f"/v1/tenants/{tenant}", a_key)).status_code == 403
    # nothing of B's was touched by A: its token is still usable, its agent still live
    assert (await api.request("GET", f"/v1/providers/{b}", b_key)).json()["agents"] == 1
    assert (await enroll(api, b_token["token"])).status_code == 201
    # the operator sees every provider's things
    assert (await api.request("GET", f"/v1/providers/{b}/agents", api.operator_key)).status_code == 200


# -- approval of managed and private pool tokens ----------------------------------------------------


def requests_path(tenant: str, token_id: str = "", action: str = "") -> str:
    """``/v1/tenants/<tenant>/enrollment-requests[/<token_id>/<action>]``."""
    return f"/v1/tenants/{tenant}/enrollment-requests" + (f"/{token_id}/{action}" if token_id else "")


def operator_path(provider: str, token_id: str, action: str) -> str:
    return f"/v1/enrollment-requests/{provider}/{token_id}/{action}"


async def statuses(api: Api, name: str, key: str) -> dict[str, str]:
    """The provider's tokens' statuses by token id, as it lists them."""
    listed = await api.request("GET", f"/v1/providers/{name}/enrollment-tokens", key)
    return {t["token_id"]: t["status"] for t in listed.json()}


async def decide(api: Api, path: str, key: str, status: int = 200) -> dict[str, Any]:
    response = await api.request("POST", path, key)
    assert response.status_code == status, (path, response.text)
    result: dict[str, Any] = response.json()
    return result


def masked(response: Any, *values: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of ``response`` with ``values`` (ids, times, secrets) blanked."""
    body = response.content
    for value in values:
        body = body.replace(value.encode(), b"<>")
    headers = {k: v for k, v in response.headers.items() if k != "x-request-id"}
    return response.status_code, headers, body


async def test_a_private_pool_token_is_pending_and_cannot_enroll(api: Api, log: EventLog) -> None:
    tenant, _ = await api.tenant()
    name, key = await provider(api)
    issued = await token(api, name, key, pool="private", owner_tenant=tenant, region="eu-north")
    assert (issued["status"], issued["pool"], issued["owner_tenant"]) == (
        "pending_approval",
        "private",
        tenant,
    )
    refused = await enroll(api, issued["token"])
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "token_not_approved"
    assert f"an admin of tenant {tenant}" in error["message"] and "approve" in error["message"]
    assert await statuses(api, name, key) == {issued["token_id"]: "pending_approval"}
    assert (await api.request("GET", f"/v1/providers/{name}", key)).json()["active_tokens"] == 0
    managed = await token(api, name, key, pool="managed", owner_tenant=tenant)
    refused = await enroll(api, managed["token"])
    assert refused.status_code == 403 and "the operator" in refused.json()["error"]["message"]
    assert not of(await records(log, "PROVIDERS"), AgentEnrolled)
    assert (await token(api, name, key))["status"] == "active"  # the shared pool: as before


async def test_unknown_and_existing_owner_tenants_get_the_same_answers(api: Api) -> None:
    """A provider key cannot tell whether a tenant id exists: issuing, enrolling and listing answer
    byte for byte the same (ids, secrets and times apart)."""
    tenant, _ = await api.tenant(f"t-{secrets.token_hex(4)}")
    unknown = f"t-{secrets.token_hex(4)}"  # of the same length
    answers = []
    for owner in (tenant, unknown):
        name, key = await provider(api, f"p-{secrets.token_hex(4)}")
        path = f"/v1/providers/{name}/enrollment-tokens"
        issuing = await api.request("POST", path, key, json={"pool": "private", "owner_tenant": owner})
        issued = issuing.json()
        enrolling = await enroll(api, issued["token"], "w-000000000000")
        listing = await api.request("GET", path, key)
        varying = (issued["token"], owner, name, issued["token_id"], issued["expires_at"])  # token first
        answers.append(
            [masked(r, *varying, listing.json()[0]["issued_at"]) for r in (issuing, enrolling, listing)]
        )
    assert answers[0] == answers[1]
    assert [status for status, _, _ in answers[0]] == [201, 403, 200]


async def test_only_an_admin_of_the_owner_tenant_approves_a_private_token(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    member = await api.key(tenant, admin, "member")
    other, other_admin = await api.tenant()
    name, key = await provider(api)
    issued = await token(api, name, key, pool="private", owner_tenant=tenant, region="eu-north")
    token_id = issued["token_id"]
    approve = requests_path(tenant, token_id, "approve")
    refusals = [
        (approve, member, 403),  # a member, not an admin, of the owner tenant
        (approve, other_admin, 404),  # another tenant's admin: as for any other tenant's resource
        (requests_path(other, token_id, "approve"), other_admin, 404),  # it does not name that tenant
        (approve, key, 403),  # the provider itself
        (operator_path(name, token_id, "approve"), key, 403),
        (approve, api.operator_key, 403),  # a private pool takes a host with its tenant's consent only
        (operator_path(name, token_id, "approve"), api.operator_key, 403),
        (approve, None, 401),
    ]
    for path, caller, status in refusals:
        response = await api.request("POST", path, caller)
        assert response.status_code == status, (path, response.text)
        assert set(response.json()) == {"error"}
    assert (await api.request("GET", requests_path(tenant), other_admin)).status_code == 404
    assert (await api.request("GET", requests_path(tenant), member)).status_code == 403
    assert (await api.request("GET", requests_path(tenant), key)).status_code == 403
    assert (await api.request("GET", requests_path(other), other_admin)).json() == []
    assert await statuses(api, name, key) == {token_id: "pending_approval"}
    assert not of(await records(log, "PROVIDERS"), EnrollmentTokenApproved)

    body = await decide(api, approve, admin)
    assert (body["status"], body["approved_by"], body["provider"]) == ("active", f"tenant:{tenant}", name)
    assert (await decide(api, approve, admin))["status"] == "active"  # again: nothing appended
    stored = [r for r in await records(log, "PROVIDERS") if isinstance(r.event, EnrollmentTokenApproved)]
    assert [(r.event.token_id, r.event.approved_by) for r in stored] == [(token_id, f"tenant:{tenant}")]
    assert stored[0].subject == f"provider.{name}.enrollment_token_approved"

    worker = f"w-{secrets.token_hex(6)}"
    enrolled = await enroll(api, issued["token"], worker)
    assert enrolled.status_code == 201, enrolled.text
    got = enrolled.json()
    assert (got["pool"], got["owner_tenant"], got["region"], got["provider"]) == (
        "private",
        tenant,
        "eu-north",
        name,
    )
    assert api.kernel is not None
    identity = enrollment_of(api.kernel.state(PROVIDERS), worker)
    assert identity is not None
    assert (identity.provider, identity.pool, identity.owner_tenant) == (name, "private", tenant)
    [listed] = (await api.request("GET", requests_path(tenant), admin)).json()
    assert (listed["token_id"], listed["status"], listed["used_by"]) == (token_id, "used", worker)
    tokens = (await api.request("GET", f"/v1/providers/{name}/enrollment-tokens", key)).json()
    assert [(t["status"], t["approved_by"]) for t in tokens] == [("used", f"tenant:{tenant}")]
    await decide(api, approve, admin, 409)  # used: nothing left to approve


async def test_the_operator_approves_a_managed_token_and_a_tenant_admin_cannot(api: Api) -> None:
    tenant, admin = await api.tenant()
    name, key = await provider(api)
    issued = await token(api, name, key, pool="managed", owner_tenant=tenant)
    token_id = issued["token_id"]
    for action in ("approve", "deny"):
        await decide(api, requests_path(tenant, token_id, action), admin, 404)  # not a private pool's
        await decide(api, operator_path(name, token_id, action), admin, 403)
        await decide(api, operator_path(name, token_id, action), key, 403)
    assert (await api.request("GET", requests_path(tenant), admin)).json() == []
    assert (await api.request("GET", "/v1/enrollment-requests", admin)).status_code == 403
    assert (await api.request("GET", "/v1/enrollment-requests", key)).status_code == 403
    await decide(api, operator_path(name, "nope", "approve"), api.operator_key, 404)
    await decide(api, operator_path("nobody", token_id, "approve"), api.operator_key, 404)
    body = await decide(api, operator_path(name, token_id, "approve"), api.operator_key)
    assert (body["status"], body["approved_by"]) == ("active", "operator")
    enrolled = (await enroll(api, issued["token"])).json()
    assert (enrolled["pool"], enrolled["owner_tenant"]) == ("managed", tenant)


async def test_a_denied_token_cannot_enroll(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    name, key = await provider(api)
    private = await token(api, name, key, pool="private", owner_tenant=tenant)
    managed = await token(api, name, key, pool="managed", owner_tenant=tenant)
    denied = await decide(api, requests_path(tenant, private["token_id"], "deny"), admin)
    assert (denied["status"], denied["revoked_by"]) == ("revoked", f"tenant:{tenant}")
    by_operator = await decide(api, operator_path(name, managed["token_id"], "deny"), api.operator_key)
    assert (by_operator["status"], by_operator["revoked_by"]) == ("revoked", "operator")
    for issued in (private, managed):
        refused = await enroll(api, issued["token"])
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "token_revoked"
    late = await decide(api, requests_path(tenant, private["token_id"], "approve"), admin, 409)
    assert "revoked" in late["error"]["message"]
    await decide(api, requests_path(tenant, private["token_id"], "deny"), admin)  # again: nothing appended
    revoked = of(await records(log, "PROVIDERS"), EnrollmentTokenRevoked)
    assert [(e.token_id, e.revoked_by) for e in revoked] == [
        (private["token_id"], f"tenant:{tenant}"),
        (managed["token_id"], "operator"),
    ]
    tokens = (await api.request("GET", f"/v1/providers/{name}/enrollment-tokens", key)).json()
    assert [(t["status"], t["revoked_by"]) for t in tokens] == [
        ("revoked", f"tenant:{tenant}"),
        ("revoked", "operator"),
    ]


async def test_consent_can_be_withdrawn_before_use_and_an_expired_request_is_not_approved(api: Api) -> None:
    tenant, admin = await api.tenant()
    name, key = await provider(api)
    issued = await token(api, name, key, pool="private", owner_tenant=tenant)
    await decide(api, requests_path(tenant, issued["token_id"], "approve"), admin)
    withdrawn = await decide(api, requests_path(tenant, issued["token_id"], "deny"), admin)
    assert (withdrawn["status"], withdrawn["approved_by"]) == ("revoked", f"tenant:{tenant}")
    assert (await enroll(api, issued["token"])).json()["error"]["code"] == "token_revoked"
    expired = EnrollmentTokenIssued(
        token_id="e" * 12,
        token_sha256="0" * 64,
        expires_ns=time.time_ns() - 1,
        pool="private",
        owner_tenant=tenant,
    )
    assert api.kernel is not None
    await api.kernel.append(provider_subject(name, expired), expired, visible_in=PROVIDERS)
    late = await decide(api, requests_path(tenant, "e" * 12, "approve"), admin, 409)
    assert "expired" in late["error"]["message"]
    assert (await decide(api, requests_path(tenant, "e" * 12, "deny"), admin))["status"] == "expired"


async def test_listings_show_the_statuses_of_requests(api: Api) -> None:
    tenant, admin = await api.tenant()
    other, other_admin = await api.tenant()
    name, key = await provider(api)
    labels = ("pending", "approved", "used", "denied")
    pending, approved, used, denied = [
        await token(api, name, key, pool="private", owner_tenant=tenant, label=label) for label in labels
    ]
    for issued in (approved, used):
        await decide(api, requests_path(tenant, issued["token_id"], "approve"), admin)
    await decide(api, requests_path(tenant, denied["token_id"], "deny"), admin)
    assert (await enroll(api, used["token"])).status_code == 201
    managed = await token(api, name, key, pool="managed", owner_tenant=tenant, label="managed")
    shared = await token(api, name, key, label="shared")
    elsewhere = await token(api, name, key, pool="private", owner_tenant=other, label="elsewhere")
    expected = {"pending": "pending_approval", "approved": "active", "used": "used", "denied": "revoked"}
    listed = (await api.request("GET", requests_path(tenant), admin)).json()
    assert [(r["label"], r["status"]) for r in listed] == list(expected.items())  # oldest first
    assert all((r["provider"], r["pool"], r["owner_tenant"]) == (name, "private", tenant) for r in listed)
    assert [r["decided_at"] is not None for r in listed] == [False, True, True, True]
    assert (await api.request("GET", requests_path(tenant), api.operator_key)).json() == listed
    theirs = (await api.request("GET", requests_path(other), other_admin)).json()
    assert [(r["label"], r["status"]) for r in theirs] == [("elsewhere", "pending_approval")]
    everyone = (await api.request("GET", "/v1/enrollment-requests", api.operator_key)).json()
    assert {r["label"]: r["status"] for r in everyone} == {
        **expected,
        "managed": "pending_approval",
        "elsewhere": "pending_approval",
    }  # not the shared pool's token: nobody approves those
    assert await statuses(api, name, key) == {
        **{t["token_id"]: expected[t["label"]] for t in (pending, approved, used, denied)},
        managed["token_id"]: "pending_approval",
        shared["token_id"]: "active",
        elsewhere["token_id"]: "pending_approval",
    }


async def test_an_enrollment_and_a_refusal_racing_never_both_win(api: Api) -> None:
    tenant, admin = await api.tenant()
    name, key = await provider(api)
    for _ in range(4):
        issued = await token(api, name, key, pool="private", owner_tenant=tenant)
        await decide(api, requests_path(tenant, issued["token_id"], "approve"), admin)
        enrolled, denied = await asyncio.gather(
            enroll(api, issued["token"]),
            api.request("POST", requests_path(tenant, issued["token_id"], "deny"), admin),
        )
        outcome = sorted([enrolled.status_code, denied.status_code])
        assert outcome in ([200, 401], [201, 409]), (enrolled.text, denied.text)
        assert api.kernel is not None
        state = api.kernel.state(PROVIDERS).providers[name].tokens[issued["token_id"]]
        assert (state.used_by is not None) != state.revoked


async def test_no_provider_key_reaches_the_approval_routes(api: Api) -> None:
    tenant, _ = await api.tenant()
    name, key = await provider(api)
    token_id = (await token(api, name, key, pool="private", owner_tenant=tenant))["token_id"]
    routes = [
        ("GET", requests_path(tenant)),
        ("POST", requests_path(tenant, token_id, "approve")),
        ("POST", requests_path(tenant, token_id, "deny")),
        ("GET", "/v1/enrollment-requests"),
        ("POST", operator_path(name, token_id, "approve")),
        ("POST", operator_path(name, token_id, "deny")),
    ]
    for method, path in routes:
        assert (await api.request(method, path)).status_code == 401, path
        denied = await api.request(method, path, key)
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "forbidden", path
    assert await statuses(api, name, key) == {token_id: "pending_approval"}
