"""The dev stack's own agents enroll like any provider's, through the gateway.

At an agent's first start the operator creates the provider ``local`` (once) and issues one
enrollment token for that agent; the agent enrolls with it and from then on runs with its own
confined credentials, kept in its state dir.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import httpx

from ops.devstack.errors import DevStackError

LOCAL_PROVIDER = "local"
LOCAL_REGION = "local"
GATEWAY_WAIT_S = 60.0


def issue_enrollment_token(
    gateway_url: str, operator_key: str, label: str, gateway: subprocess.Popen[bytes] | None, log_file: Path
) -> str:
    """Once the gateway answers, create provider ``local`` (if it does not exist yet) and issue an
    enrollment token labelled ``label`` in region ``local``, as the operator."""
    headers = {"Authorization": f"Bearer {operator_key}"}
    with httpx.Client(base_url=gateway_url, headers=headers, timeout=10.0) as client:
        wait_for_gateway(client, gateway, log_file)
        created = client.post("/v1/providers", json={"provider": LOCAL_PROVIDER, "display_name": "This host"})
        if created.status_code not in (201, 409):
            raise DevStackError(f"could not create provider {LOCAL_PROVIDER}: {created.text[:200]}")
        issued = client.post(
            f"/v1/providers/{LOCAL_PROVIDER}/enrollment-tokens",
            json={"region": LOCAL_REGION, "label": label},
        )
        if issued.status_code != 201:
            raise DevStackError(f"could not issue an enrollment token: {issued.text[:200]}")
    token: str = issued.json()["token"]
    return token


def wait_for_gateway(client: httpx.Client, process: subprocess.Popen[bytes] | None, log_file: Path) -> None:
    """Return once the gateway at ``client``'s base URL answers ``/v1/health``.

    Raises:
        DevStackError: ``process`` exited, or no answer within :data:`GATEWAY_WAIT_S`; the message
            names ``log_file``.
    """
    deadline = time.monotonic() + GATEWAY_WAIT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise DevStackError(f"the gateway at {client.base_url} exited during start-up; see {log_file}")
        with contextlib.suppress(httpx.HTTPError):
            if client.get("/v1/health").status_code == 200:
                return
        time.sleep(0.2)
    raise DevStackError(
        f"the gateway at {client.base_url} did not answer within {GATEWAY_WAIT_S:.0f}s; see {log_file}"
    )
