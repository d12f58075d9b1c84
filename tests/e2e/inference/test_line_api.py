"""The line's refusals through the app (in-process, no engine): an endpoint whose replica never comes
keeps a request in line until its deadline, then answers 429 with Retry-After; one more request than
the line holds is refused at once; both are counted in the traffic view and /metrics."""

from __future__ import annotations

import asyncio
import time

from gateway.queueing import UNKNOWN_RETRY_S
from tests.support.gateway import Api


async def test_a_wait_past_the_deadline_and_a_full_line_are_429s_with_retry_after(api: Api) -> None:
    tenant, admin = await api.tenant()
    spec = {"name": "slow", "model": "all-MiniLM-L6-v2", "queue_timeout_s": 1.0, "max_queue": 1}
    deployed = await api.request("POST", "/v1/endpoints", admin, json=spec)
    assert deployed.status_code == 201, deployed.text
    assert (
        deployed.json()["spec"]["max_concurrency"] == 8
        and deployed.json()["spec"]["routing"] == "round_robin"
    )
    body = {"model": "slow", "input": "x"}
    t0 = time.monotonic()
    waiting = asyncio.create_task(api.request("POST", "/v1/embeddings", admin, json=body))
    await asyncio.sleep(0.3)
    full = await api.request("POST", "/v1/embeddings", admin, json=body)
    assert full.status_code == 429 and time.monotonic() - t0 < 1.0  # refused at once
    assert (
        full.json()["error"]["code"] == "rate_limit_exceeded"
        and "max_queue 1" in full.json()["error"]["message"]
    )
    timed_out = await waiting
    assert timed_out.status_code == 429 and time.monotonic() - t0 >= 1.0
    assert timed_out.json() == {
        "error": {
            "message": "waited 1s in line for a replica",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert timed_out.headers["retry-after"] == str(UNKNOWN_RETRY_S)  # nothing finished yet: a guess
    view = (await api.request("GET", f"/v1/endpoints/{deployed.json()['endpoint_id']}", admin)).json()
    assert view["traffic"]["rejected"] == 2 and view["traffic"]["queue_depth"] == 0
    metrics = (await api.request("GET", "/metrics", api.operator_key)).text
    for reason in ("queue_full", "queue_timeout"):
        labels = f'endpoint="slow",reason="{reason}",tenant="{tenant}"'
        assert f"resontech_endpoint_rejected_total{{{labels}}} 1.0" in metrics


async def test_a_bad_line_spec_is_refused(api: Api) -> None:
    _, admin = await api.tenant()
    for bad in ({"max_concurrency": 0}, {"max_queue": -1}, {"queue_timeout_s": 0}, {"routing": "random"}):
        refused = await api.request("POST", "/v1/endpoints", admin, json={"name": "e", "model": "m/x", **bad})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_body", bad
