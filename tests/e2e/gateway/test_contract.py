"""The API's contract, fuzzed: schemathesis generates requests from ``/openapi.json`` (valid and
invalid bodies, queries and path parameters) against a real served gateway, and no input may yield a
5xx. Every operation is run with a tenant admin's key, and the operator's routes with the
operator's key too."""

from __future__ import annotations

from typing import Any

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings

from tests.support.gateway import GatewayServer

EXAMPLES = 15
"""Generated requests per operation and key (small: the suite stays fast; the CI run is a smoke test
of the contract, not a long fuzzing campaign)."""


def run_operation(
    operation: Any, base_url: str, key: str, session: requests.Session
) -> tuple[int, list[str]]:
    failures: list[str] = []
    calls = 0

    @hypothesis.given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case: schemathesis.Case) -> None:
        nonlocal calls
        calls += 1
        response = case.call(base_url=base_url, session=session, headers={"Authorization": f"Bearer {key}"})
        if response.status_code >= 500:
            failures.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
            )
        elif response.status_code >= 400:
            body = response.json()
            assert set(body) == {"error"} and body["error"]["code"] and body["error"]["message"], body

    check()
    return calls, failures


async def test_no_generated_request_yields_a_5xx(gateway_server: GatewayServer) -> None:
    _, admin = await gateway_server.tenant()
    schema = schemathesis.openapi.from_url(f"{gateway_server.url}/openapi.json")
    failures: list[str] = []
    operations = calls = 0
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            keys = [admin]
            if operation.definition.raw.get("tags") == ["tenants"] or "operator" in str(operation.path):
                keys.append(gateway_server.operator_key)
            for key in keys:
                made, failed = run_operation(operation, gateway_server.url, key, session)
                calls += made
                failures += failed
            operations += 1
    assert operations >= 30, f"only {operations} operations in the document"
    assert calls >= operations * 5, f"only {calls} requests generated for {operations} operations"
    assert not failures, "\n".join(failures[:20])
