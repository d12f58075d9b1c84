"""Provider accounts, their keys, enrollment tokens and agents, and agent enrollment: keys and tokens
shown once and stored hashed, one-time tokens, scoping (another provider's things are not found),
and bad input refused with nothing appended."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
import warnings
from typing import Any

import pytest

from core.log import EventLog
from core.streams import provider_subject
from projections import PROVIDERS
from schemas.providers import AgentCredentialsRevoked, AgentEnrolled, EnrollmentTokenIssued
from tests.gateway.conftest import Api
from tests.support import of, records

with warnings.catch_warnings():  # deprecated in 3.11 (see core.natsauth); the server's bcrypt
    warnings.simplefilter("ignore", DeprecationWarning)
    import crypt


async def provider(api: Api, name: str | None = None) -> tuple[str, str]:
    """Create a provider; returns ``(provider id, its first key)``."""
    name = name or f"p-{secrets.token_hex(4)}"
    response = await api.request(
        "POST", "/v1/providers", api.operator_key, json={"provider": name, "display_name": "GPU Co"}
    )
    assert response.status_code == 201, response.text
    return name, response.json()["api_key"]["key"]


async def token(api: Api, name: str, key: str, **body: Any) -> dict[str, Any]:
    response = await api.request("POST", f"/v1/providers/{name}/enrollment-tokens", key, json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


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
    assert crypt.crypt(nats["password"], enrolled.nats_password_bcrypt) == enrolled.nats_password_bcrypt
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
        ({"pool": "private", "owner_tenant": "no-such-tenant"}, "is not a tenant"),
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


async def test_a_managed_pool_token_names_its_tenant(api: Api) -> None:
    tenant, _ = await api.tenant()
    name, key = await provider(api)
    issued = await token(api, name, key, pool="managed", owner_tenant=tenant)
    body = (await enroll(api, issued["token"])).json()
    assert (body["pool"], body["owner_tenant"]) == ("managed", tenant)


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
