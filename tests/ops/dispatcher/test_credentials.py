"""A cluster's own credentials: ``resontech dispatcher enroll`` writes them (for the owner only),
``dispatcher run --credentials`` reads them, and every wrong file or option is a one-line error."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError, EnrollmentRefused
from core.log import EventLog
from core.settings import Settings
from ops.dispatcher import credentials, run
from ops.dispatcher.credentials import DispatcherCredentials
from ops.enrollment import enroll_cluster
from projections import PROVIDERS
from projections.runner import rebuild
from tests.support import REPO

CREDS = DispatcherCredentials(
    cluster="lab", provider="prov", region="eu-north", nats_user="dispatcher-lab", nats_password="s3cret"
)


def _args(**given: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in given.items():
        setattr(args, name, value)
    return args


def test_the_file_is_the_owners_alone_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "lab.json"
    credentials.write(path, CREDS)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert credentials.read(path) == CREDS
    settings = CREDS.connection(Settings(nats_user="kernel", nats_password="k"))
    assert (settings.nats_user, settings.nats_password) == ("dispatcher-lab", "s3cret")
    assert (settings.nats_inbox_prefix, settings.nats_js_api_prefix) == ("_INBOX_kernel-lab", "JS.KERNEL.API")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{oops", "is not a dispatcher's credentials file"),
        ('{"cluster": "lab"}', "is not a dispatcher's credentials file"),
        (
            '{"cluster": "lab", "provider": "p", "nats_user": "agent-w-1", "nats_password": "x"}',
            "is not cluster lab's dispatcher",
        ),
        (
            '{"cluster": "a.b", "provider": "p", "nats_user": "dispatcher-a.b", "nats_password": "x"}',
            "cluster 'a.b'",
        ),
    ],
)
def test_a_wrong_file_is_a_config_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "creds.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        credentials.read(path)


def test_run_takes_the_identity_from_the_file_and_refuses_what_would_contradict_it(tmp_path: Path) -> None:
    path = tmp_path / "lab.json"
    credentials.write(path, CREDS)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: k\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: k, context: {cluster: k, user: u}}]\n"
    )
    cluster, identity, state_dir, _ = run.dispatcher_of(
        _args(credentials=path, kubeconfig=kubeconfig), Settings(data_dir=str(tmp_path))
    )
    cluster.close()
    assert (identity.cluster, identity.provider, identity.region) == ("lab", "prov", "eu-north")
    assert state_dir == tmp_path / "dispatcher" / "lab"
    with pytest.raises(ConfigError, match="come from the file"):
        run.dispatcher_of(_args(credentials=path, cluster="other"), Settings())
    with pytest.raises(ConfigError, match="--vouch needs the kernel's credentials"):
        run.dispatcher_of(_args(credentials=path, vouch=True), Settings())
    with pytest.raises(ConfigError, match="--cluster and --provider are needed"):
        run.dispatcher_of(_args(), Settings())


def _cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)


async def test_enroll_writes_credentials_once_per_cluster_and_keeps_its_terms(
    log: EventLog, tmp_path: Path
) -> None:
    out = tmp_path / "lab.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env["RESONTECH_NATS_URL"] = log.settings.nats_url
    base = [sys.executable, "-m", "ops.cli", "dispatcher", "enroll", "--cluster", "lab", "--provider", "prov"]
    done = await asyncio.to_thread(_cli, [*base, "--region", "eu-north", "--out", str(out)], env)
    assert done.returncode == 0, done.stderr
    assert f"resontech dispatcher run --credentials {out}" in done.stdout
    written = credentials.read(out)
    assert (written.cluster, written.provider, written.region, written.nats_user) == (
        "lab",
        "prov",
        "eu-north",
        "dispatcher-lab",
    )
    state, _ = await rebuild(log, PROVIDERS)
    cluster = state.providers["prov"].clusters["lab"]
    assert written.nats_password not in cluster.nats_password_bcrypt and cluster.nats_password_bcrypt
    # the same cluster under other terms: refused, with why, no traceback
    refused = await asyncio.to_thread(
        _cli, [*base, "--region", "us-east", "--out", str(tmp_path / "x.json")], env
    )
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "lab's nodes are enrolled as" in refused.stderr and not (tmp_path / "x.json").exists()
    with pytest.raises(EnrollmentRefused, match="enrolled by another provider"):
        await enroll_cluster(log, "lab", provider="someone-else", region="eu-north")
    with pytest.raises(EnrollmentRefused, match="DNS label"):
        await enroll_cluster(log, "Lab_1", provider="prov")
    again = await enroll_cluster(log, "lab", provider="prov", region="eu-north")
    assert again.password is not None and again.password != written.nats_password  # a new password
    kept = await enroll_cluster(log, "lab", provider="prov", region="eu-north", rotate=False)
    assert kept.password is None and kept.token_id == cluster.token_id == again.token_id
