"""The endpoints lifecycle API: deploy (checked like a job), scale bounds, delete, list, get with
replicas; scoping and bad input."""

from __future__ import annotations

from typing import Any

from core.log import EventLog
from core.streams import endpoint_subject
from projections import ENDPOINTS
from schemas.commands import StopWork
from schemas.endpoints import EndpointDeployed, EndpointReplicaPlaced, EndpointReplicaReady, EndpointScaled
from schemas.values import Assignment, Provenance
from tests.support import records
from tests.support.accounts import provider_key, register_worker
from tests.support.gateway import Api, deploy, deploy_body


async def test_deploy_get_and_list(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    member = await api.key(tenant, admin, "member")
    created = await deploy(api, member, deploy_body(max_replicas=3, target_rps_per_replica=4.5))
    assert created.status_code == 201, created.text
    endpoint = created.json()
    assert endpoint["state"] == "deploying" and endpoint["desired_replicas"] == 1
    assert endpoint["spec"]["scale_to_zero_after_s"] == 300 and endpoint["spec"]["model_source"] == "hub"
    assert endpoint["spec"]["deployed_by"] == f"tenant:{tenant}" and endpoint["replicas"] == []
    got = await api.request("GET", f"/v1/endpoints/{endpoint['endpoint_id']}", member)
    assert got.json() == endpoint
    listed = (await api.request("GET", "/v1/endpoints", member)).json()
    assert [e["endpoint_id"] for e in listed["items"]] == [endpoint["endpoint_id"]]
    [stored] = await records(log, "ENDPOINTS")
    assert isinstance(stored.event, EndpointDeployed) and stored.event.target_rps_per_replica == 4.5
    pinned = await deploy(api, member, deploy_body(name="pinned", min_replicas=2, max_replicas=2))
    assert pinned.json()["spec"]["scale_to_zero_after_s"] is None and pinned.json()["desired_replicas"] == 2


async def test_a_workspace_model_must_exist(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    body = deploy_body(model="model_out/run-1/", model_source="workspace")
    missing = await deploy(api, admin, body)
    assert missing.status_code == 422
    assert missing.json()["error"]["code"] == "missing_objects"
    assert "model_out/run-1/" in missing.json()["error"]["message"]
    assert await records(log, "ENDPOINTS") == []
    api.kernel.s3.put_object(Bucket=f"rt-{tenant}", Key="model_out/run-1/model.safetensors", Body=b"w")
    created = await deploy(api, admin, body)
    assert created.status_code == 201 and created.json()["spec"]["model_source"] == "workspace"


BAD: list[tuple[dict[str, Any], int, str]] = [
    (deploy_body(surprise=True), 400, "invalid_body"),
    (deploy_body(max_replicas=0), 400, "invalid_body"),
    (deploy_body(max_replicas=100), 400, "invalid_body"),
    (deploy_body(scale_to_zero_after_s=1), 400, "invalid_body"),
    (deploy_body(engine="tensorrt"), 400, "invalid_body"),
    (deploy_body(target_rps_per_replica=0), 400, "invalid_body"),
    (deploy_body(image="vllm/vllm-openai:latest --privileged"), 400, "invalid_body"),
    (deploy_body(image="$(VLLM_API_KEY)"), 400, "invalid_body"),
    (deploy_body(min_replicas=3, max_replicas=2), 422, "invalid_spec"),
    (deploy_body(model="not a model!"), 422, "invalid_spec"),
    # a repo id the agent's cache lookup would refuse is refused here first (core.hub's grammar)
    (deploy_body(model="org/../secrets"), 422, "invalid_spec"),
    (deploy_body(model="a--b/c"), 422, "invalid_spec"),
    (deploy_body(model="org/name@../../refs"), 422, "invalid_spec"),
    (deploy_body(engine="cpu", gpu_type="A100"), 422, "invalid_spec"),
    (deploy_body(min_replicas=1, scale_to_zero_after_s=60), 422, "invalid_spec"),
    (deploy_body(model="../secrets/", model_source="workspace"), 422, "invalid_key"),
    (deploy_body(pool="private"), 422, "unplaceable"),
    (deploy_body(gpu_type="H100"), 422, "unplaceable"),
]


async def test_bad_deployments_are_refused_and_append_nothing(api: Api, log: EventLog) -> None:
    _, admin = await api.tenant()
    await register_worker(api, "w-cpu-only")
    for body, status, code in BAD:
        response = await deploy(api, admin, body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["code"] == code, (body, response.text)
    response = await api.request(
        "POST", "/v1/endpoints", admin, content=b"[1,2", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert await records(log, "ENDPOINTS") == []
    pinned = await deploy(api, admin, deploy_body(model="HuggingFaceTB/SmolLM2-135M-Instruct@v1.0"))
    assert pinned.status_code == 201, pinned.text  # a revision is part of the grammar
    own = await deploy(api, admin, deploy_body(name="own-engine", image="ghcr.io/acme/vllm:0.11-patched"))
    assert own.status_code == 201 and own.json()["spec"]["image"] == "ghcr.io/acme/vllm:0.11-patched"


async def test_ids_and_live_names_are_unique_and_a_keyed_retry_is_stored_once(
    api: Api, log: EventLog
) -> None:
    _, admin = await api.tenant()
    first = await deploy(api, admin, deploy_body(endpoint_id="ep-fixed"))
    assert first.status_code == 201
    assert (await deploy(api, admin, deploy_body(endpoint_id="ep-fixed", name="other"))).status_code == 409
    same_name = await deploy(api, admin, deploy_body())
    assert same_name.status_code == 409 and "ep-fixed" in same_name.json()["error"]["message"]
    headers = {"Idempotency-Key": "deploy-7"}
    one = await deploy(api, admin, deploy_body(name="keyed"), headers=headers)
    two = await deploy(api, admin, deploy_body(name="keyed"), headers=headers)
    assert one.status_code == two.status_code == 201
    assert one.json()["endpoint_id"] == two.json()["endpoint_id"]
    assert two.headers["Idempotent-Replayed"] == "true"
    assert len(await records(log, "ENDPOINTS")) == 2


async def test_scale_sets_bounds_and_brings_the_desired_count_inside(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    endpoint_id = (await deploy(api, admin, deploy_body(max_replicas=4))).json()["endpoint_id"]
    path = f"/v1/endpoints/{endpoint_id}/scale"
    scaled = await api.request("PUT", path, admin, json={"min_replicas": 3, "max_replicas": 5})
    assert scaled.status_code == 200, scaled.text
    body = scaled.json()
    assert (body["spec"]["min_replicas"], body["spec"]["max_replicas"], body["desired_replicas"]) == (3, 5, 3)
    assert "3..5" in body["scale_reason"]
    lowered = (await api.request("PUT", path, admin, json={"min_replicas": 0, "max_replicas": 2})).json()
    assert (
        lowered["spec"]["min_replicas"],
        lowered["spec"]["max_replicas"],
        lowered["desired_replicas"],
    ) == (0, 2, 2)
    [*_, last] = await records(log, "ENDPOINTS")
    assert isinstance(last.event, EndpointScaled) and last.event.by == f"tenant:{tenant}"
    bad = await api.request("PUT", path, admin, json={"min_replicas": 4, "max_replicas": 2})
    assert bad.status_code == 422 and "max_replicas" in bad.json()["error"]["message"]
    assert (await api.request("PUT", path, admin, json={"min_replicas": 1})).status_code == 400
    await api.request("DELETE", f"/v1/endpoints/{endpoint_id}", admin)
    gone = await api.request("PUT", path, admin, json={"min_replicas": 1, "max_replicas": 2})
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "endpoint_deleted"


async def test_replicas_show_and_delete_stops_them(api: Api, log: EventLog) -> None:
    tenant, admin = await api.tenant()
    endpoint_id = (await deploy(api, admin, deploy_body())).json()["endpoint_id"]
    replica = Assignment(assignment_id=f"{endpoint_id}-s0-e1", worker_id="w-serve", slot=0, epoch=1)
    for event in (
        EndpointReplicaPlaced(assignments=[replica], provenance=Provenance(candidates=1)),
        EndpointReplicaReady(assignment_id=replica.assignment_id, epoch=1, address="http://10.0.0.5:8000"),
    ):
        await api.kernel.append(endpoint_subject(tenant, endpoint_id, event), event, visible_in=ENDPOINTS)
    serving = (await api.request("GET", f"/v1/endpoints/{endpoint_id}", admin)).json()
    assert serving["state"] == "serving" and serving["ready_replicas"] == 1
    [shown] = serving["replicas"]
    assert (shown["worker_id"], shown["state"], shown["address"]) == (
        "w-serve",
        "ready",
        "http://10.0.0.5:8000",
    )
    deleted = await api.request("DELETE", f"/v1/endpoints/{endpoint_id}", admin)
    assert deleted.status_code == 204
    again = await api.request("DELETE", f"/v1/endpoints/{endpoint_id}", admin)
    assert again.status_code == 204
    kinds = [type(r.event).__name__ for r in await records(log, "ENDPOINTS")]
    assert kinds.count("EndpointDeleted") == 1
    [stop] = [r.event for r in await records(log, "COMMANDS")]
    assert isinstance(stop, StopWork) and stop.assignment_id == replica.assignment_id
    assert (await api.request("GET", "/v1/endpoints", admin)).json()["items"] == []
    listed = (await api.request("GET", "/v1/endpoints?include_deleted=true", admin)).json()["items"]
    assert [e["state"] for e in listed] == ["deleted"] and listed[0]["deleted_at"]
    assert len((await api.request("GET", "/v1/endpoints?state=deleted", admin)).json()["items"]) == 1


async def test_auth_roles_and_scoping(api: Api) -> None:
    a, a_admin = await api.tenant()
    _, b_admin = await api.tenant()
    viewer = await api.key(a, a_admin, "viewer")
    provider = await provider_key(api, "prov-e")
    endpoint_id = (await deploy(api, a_admin, deploy_body())).json()["endpoint_id"]
    scale = {"min_replicas": 0, "max_replicas": 2}
    routes: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/v1/endpoints", None),
        ("GET", f"/v1/endpoints/{endpoint_id}", None),
        ("PUT", f"/v1/endpoints/{endpoint_id}/scale", scale),
        ("DELETE", f"/v1/endpoints/{endpoint_id}", None),
    ]
    assert (await deploy(api, None, deploy_body(name="x"))).status_code == 401
    assert (await deploy(api, viewer, deploy_body(name="x"))).status_code == 403
    assert (await deploy(api, provider, deploy_body(name="x"))).status_code == 403
    for method, path, body in routes:
        assert (await api.request(method, path, json=body)).status_code == 401, path
        assert (await api.request(method, path, provider, json=body)).status_code == 403, path
    for method, path, body in routes[2:]:
        assert (await api.request(method, path, viewer, json=body)).status_code == 403, path
    for method, path, body in routes[1:]:
        response = await api.request(method, path, b_admin, json=body)
        assert response.status_code == 404, path
    assert (await api.request("GET", "/v1/endpoints", b_admin)).json()["items"] == []
    seen = await api.request("GET", f"/v1/endpoints/{endpoint_id}?tenant={a}", api.operator_key)
    assert seen.status_code == 200


async def test_list_pagination_and_bad_cursor(api: Api) -> None:
    _, admin = await api.tenant()
    for n in range(5):
        assert (await deploy(api, admin, deploy_body(name=f"ep{n}"))).status_code == 201
    names: list[str] = []
    url = "/v1/endpoints?limit=2"
    while url:
        page = (await api.request("GET", url, admin)).json()
        names += [e["spec"]["name"] for e in page["items"]]
        url = f"/v1/endpoints?limit=2&after={page['next']}" if page["next"] else ""
    assert names == ["ep4", "ep3", "ep2", "ep1", "ep0"]
    bad = await api.request("GET", "/v1/endpoints?after=%%%", admin)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"
