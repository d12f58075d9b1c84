"""Tenancy: the operator creates tenants, keys are shown once and stored hashed, roles, revocation,
scoping, and the audit record of every accepted mutating request."""

from __future__ import annotations

import hashlib

from core.log import EventLog
from schemas.audit import RequestRecorded
from tests.support import records
from tests.support.gateway import Api


async def test_operator_creates_a_tenant_with_a_bucket_and_a_first_admin_key(api: Api, log: EventLog) -> None:
    response = await api.request(
        "POST", "/v1/tenants", api.operator_key, json={"tenant": "acme", "display_name": "Acme ML"}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["tenant"]["bucket"] == "rt-acme"
    key = body["admin_key"]["key"]
    assert key.startswith("rt_")
    buckets = {b["Name"] for b in api.kernel.s3.list_buckets()["Buckets"]}
    assert "rt-acme" in buckets
    # only the digest is stored
    stored = await records(log, "TENANTS")
    issued = [r.event for r in stored if r.event.event_name() == "api_key_issued"]
    assert issued[0].key_sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert all(key not in repr(r.event) for r in stored)
    me = await api.request("GET", "/v1/me", key)
    assert me.json() == {
        "principal": "tenant:acme",
        "kind": "tenant",
        "account": "acme",
        "role": "admin",
        "key_id": body["admin_key"]["key_id"],
    }


async def test_a_duplicate_tenant_is_a_conflict_and_bad_ids_are_refused(api: Api) -> None:
    await api.tenant("dup")
    again = await api.request(
        "POST", "/v1/tenants", api.operator_key, json={"tenant": "dup", "display_name": "x"}
    )
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "conflict"
    for bad in ("A", "UPPER", "has.dot", "x" * 41):
        response = await api.request(
            "POST", "/v1/tenants", api.operator_key, json={"tenant": bad, "display_name": "x"}
        )
        assert response.status_code == 400, bad
        assert "tenant" in response.json()["error"]["message"]


async def test_keys_roles_and_revocation(api: Api) -> None:
    tenant, admin = await api.tenant()
    viewer = await api.key(tenant, admin, "viewer")
    member = await api.key(tenant, admin, "member")
    assert (await api.request("GET", f"/v1/tenants/{tenant}", viewer)).status_code == 200
    listed = await api.request("GET", f"/v1/tenants/{tenant}/keys", member)
    assert listed.status_code == 403
    assert "admin" in listed.json()["error"]["message"]
    keys = (await api.request("GET", f"/v1/tenants/{tenant}/keys", admin)).json()
    assert {k["role"] for k in keys} == {"admin", "viewer", "member"}
    assert all("key" not in k for k in keys)
    viewer_id = next(k["key_id"] for k in keys if k["role"] == "viewer")
    revoked = await api.request("DELETE", f"/v1/tenants/{tenant}/keys/{viewer_id}", admin)
    assert revoked.status_code == 204
    refused = await api.request("GET", "/v1/me", viewer)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "key_revoked"


async def test_auth_is_required_and_other_tenants_are_not_found(api: Api) -> None:
    a, a_key = await api.tenant()
    b, _ = await api.tenant()
    assert (await api.request("GET", "/v1/me")).status_code == 401
    assert (await api.request("GET", "/v1/me", "rt_nope")).status_code == 401
    assert (await api.request("GET", "/v1/me", headers={"Authorization": "Basic abc"})).status_code == 401
    assert (await api.request("GET", f"/v1/tenants/{b}", a_key)).status_code == 404
    assert (await api.request("GET", f"/v1/tenants/{b}/keys", a_key)).status_code == 404
    assert (await api.request("GET", "/v1/tenants", a_key)).status_code == 403
    quota = await api.request("PUT", f"/v1/tenants/{a}/quotas/shared", a_key, json={"gpus": 4})
    assert quota.status_code == 403


async def test_quota_is_set_by_the_operator(api: Api) -> None:
    tenant, _ = await api.tenant()
    response = await api.request(
        "PUT", f"/v1/tenants/{tenant}/quotas/shared", api.operator_key, json={"gpus": 8}
    )
    assert response.json()["quotas"] == {"shared": 8}
    bad_pool = await api.request(
        "PUT", f"/v1/tenants/{tenant}/quotas/moon", api.operator_key, json={"gpus": 8}
    )
    assert bad_pool.status_code == 400
    cleared = await api.request(
        "PUT", f"/v1/tenants/{tenant}/quotas/shared", api.operator_key, json={"gpus": None}
    )
    assert cleared.json()["quotas"] == {}


async def test_bad_bodies_are_4xx_and_append_nothing(api: Api, log: EventLog) -> None:
    before = await log.last_seq("TENANTS")
    audit_before = await log.last_seq("AUDIT")
    cases = [
        (b"{not json", 400),
        (b'{"tenant": "ok-name", "display_name": "x", "surprise": 1}', 400),
        (b'{"tenant": 5, "display_name": "x"}', 400),
        (b"", 400),
        (b'{"tenant": "ok-name", "display_name": "' + b"x" * 70_000 + b'"}', 413),
    ]
    for body, status in cases:
        response = await api.request(
            "POST",
            "/v1/tenants",
            api.operator_key,
            content=body,
            headers={"content-type": "application/json"},
        )
        assert response.status_code == status, (body[:40], response.text)
        error = response.json()["error"]
        assert error["code"] and error["message"]
    assert await log.last_seq("TENANTS") == before
    assert await log.last_seq("AUDIT") == audit_before


async def test_every_accepted_mutating_request_is_recorded(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    created = await api.request(
        "POST", f"/v1/tenants/{tenant}/keys", admin, json={"role": "viewer", "label": "ci"}
    )
    await api.request("GET", f"/v1/tenants/{tenant}", admin)  # reads are not recorded
    audit = [r for r in await records(log, "AUDIT") if isinstance(r.event, RequestRecorded)]
    assert [(r.event.principal, r.event.method, r.event.route) for r in audit] == [
        ("operator", "POST", "/v1/tenants"),
        (f"tenant:{tenant}", "POST", "/v1/tenants/{tenant}/keys"),
    ]
    last = audit[-1]
    assert last.subject == f"api.{tenant}.tenant"
    assert last.event.resource == created.json()["key_id"]
    assert last.event.request_id == created.headers["x-request-id"]


async def test_unknown_routes_and_methods_answer_json(api: Api) -> None:
    missing = await api.request("GET", "/v1/nothing-here", api.operator_key)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong = await api.request("PATCH", "/v1/tenants", api.operator_key)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


async def test_openapi_document_and_docs_page(api: Api) -> None:
    doc = (await api.request("GET", "/openapi.json")).json()
    assert doc["openapi"] == "3.1.0"
    assert "/v1/tenants/{tenant}/keys" in doc["paths"]
    assert doc["paths"]["/v1/tenants"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert "ErrorBody" in doc["components"]["schemas"]
    page = await api.request("GET", "/docs")
    assert page.status_code == 200 and "openapi.json" in page.text
