"""The user commands of the ``resontech`` CLI against a real served gateway: login, upload with the
workspace, submit from YAML and TOML, jobs/status/why/cancel, --json, and errors as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gateway import Client
from tests.support import REPO
from tests.support.gateway import GatewayServer


class Cli:
    def __init__(self, server: GatewayServer, home: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
        self.env.update(XDG_CONFIG_HOME=str(home), RESONTECH_DATA_DIR=str(home / "no-stack"))
        self.url = server.url

    def __call__(self, *argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *argv],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if ok:
            assert done.returncode == 0, done.stderr
        return done


def test_login_upload_submit_status_cancel(gateway_server: GatewayServer, tmp_path: Path) -> None:
    with Client(gateway_server.url, gateway_server.operator_key) as operator:
        created = operator.create_tenant("cli-co", "CLI Co")
    cli = Cli(gateway_server, tmp_path / "home")
    login = cli("login", "--url", gateway_server.url, "--key", created.admin_key.key)
    assert "logged in" in login.stdout and "tenant:cli-co" in login.stdout
    assert (tmp_path / "home" / "resontech" / "credentials.json").stat().st_mode & 0o777 == 0o600
    assert "tenant:cli-co (admin)" in cli("whoami").stdout  # remembered: no --url/--key any more

    script = tmp_path / "train.py"
    script.write_text("print('RESONTECH_PROGRESS {\"loss\": 0.5}')\n")
    assert "uploaded" in cli("upload", str(script), "scripts/train.py").stdout
    assert "scripts/train.py" in cli("ls", "scripts/").stdout
    folder = REPO / "examples" / "fedavg-jobfolder" / "flare"
    uploaded = cli("upload", str(folder), "jobs/jf/flare/").stdout
    assert "uploaded jobs/jf/flare/app_client/custom/train.py" in uploaded and "__pycache__" not in uploaded
    assert "jobs/jf/flare/meta.json" in cli("ls", "jobs/jf/").stdout
    no_prefix = cli("upload", str(folder), "jobs/jf/flare", ok=False)
    assert no_prefix.returncode != 0 and "a prefix ending in '/'" in no_prefix.stderr

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: hello\nkind: process\nshards: 1\n"
        "command: [python3, scripts/train.py]\ninputs: [scripts/train.py]\n"
    )
    submitted = json.loads(cli("submit", str(spec), "--json").stdout)
    job_id = submitted["job_id"]
    assert submitted["state"] == "queued"
    listed = json.loads(cli("jobs", "--json").stdout)
    assert [j["job_id"] for j in listed] == [job_id]
    status = cli("status", job_id).stdout
    assert f"job {job_id} (hello, process) of cli-co: queued" in status
    assert cli("why", job_id).stdout.strip()  # a queued job says why it waits
    assert "cancelled" in cli("cancel", job_id).stdout
    again = cli("cancel", job_id, ok=False)
    assert again.returncode == 1 and again.stderr.startswith("error: ") and "Traceback" not in again.stderr

    toml = tmp_path / "job.toml"
    toml.write_text('name = "again"\nkind = "process"\ncommand = ["true"]\ninputs = ["scripts/missing.py"]\n')
    missing = cli("submit", str(toml), ok=False)
    assert missing.returncode == 1 and "scripts/missing.py" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_errors_are_one_friendly_line(gateway_server: GatewayServer, tmp_path: Path) -> None:
    cli = Cli(gateway_server, tmp_path / "home")
    bad_key = cli("whoami", "--url", gateway_server.url, "--key", "rt_000000000000_" + "y" * 40, ok=False)
    assert bad_key.returncode == 1 and bad_key.stderr.strip() == "error: unknown API key"
    nowhere = cli("whoami", "--url", "http://127.0.0.1:1", "--key", "k", ok=False)
    assert nowhere.returncode == 1 and "cannot reach the gateway" in nowhere.stderr
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: [unclosed\n")
    broken = cli("submit", str(bad_yaml), "--url", gateway_server.url, "--key", "k", ok=False)
    assert broken.returncode != 0 and "not valid yaml" in broken.stderr and "Traceback" not in broken.stderr


def test_endpoints_and_status_of_an_endpoint(gateway_server: GatewayServer, tmp_path: Path) -> None:
    """The endpoint commands' shape; the figures of real traffic are checked against the API in
    tests/e2e/dashboard/test_dashboard.py (an engine serves there)."""
    with Client(gateway_server.url, gateway_server.operator_key) as operator:
        admin = operator.create_tenant("ep-co", "Endpoint Co").admin_key.key
    cli = Cli(gateway_server, tmp_path / "home")
    auth = ("--url", gateway_server.url, "--key", admin)
    spec = tmp_path / "endpoint.yaml"
    spec.write_text("name: chat\nmodel: HuggingFaceTB/SmolLM2-135M-Instruct\nmin_replicas: 1\n")
    deployed = json.loads(
        cli("deploy", str(spec), "--routing", "session", "--max-queue", "5", "--json", *auth).stdout
    )
    endpoint = deployed["endpoint_id"]
    spec_shown = deployed["spec"]
    assert (spec_shown["routing"], spec_shown["max_queue"]) == ("session", 5)  # the flags over the file

    listed = cli("endpoints", *auth).stdout.splitlines()
    assert listed[0].split()[:4] == [endpoint, "chat", "deploying", "0/1"]
    assert listed[1].strip() == "last 60 s: no requests"
    status = cli("status", endpoint, *auth).stdout
    assert f"endpoint {endpoint} (chat, HuggingFaceTB/SmolLM2-135M-Instruct) of ep-co: deploying" in status
    assert "replicas: 0/1 ready (min 1, max 1, target 10 rps per replica, never to zero)" in status
    assert "traffic, last 60 s: no requests" in status
    assert "serving: 8 requests per replica, then a line of 5 (up to 120 s each); routing session" in status
    as_json = json.loads(cli("status", endpoint, "--json", *auth).stdout)
    assert as_json["traffic"] == {
        "requests": 0,
        "rps": 0.0,
        "error_rate": 0.0,
        "p50_ms": 0.0,
        "p95_ms": 0.0,
        "p99_ms": 0.0,
        "queue_depth": 0,
        "in_flight": 0,
        "wait_p50_ms": 0.0,
        "wait_p99_ms": 0.0,
        "rejected": 0,
    }
    missing = cli("status", "nothing-here", *auth, ok=False)
    assert missing.returncode == 1 and missing.stderr.strip() == "error: no job or endpoint nothing-here"
