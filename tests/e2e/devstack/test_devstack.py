"""The dev stack and its object store: real rclone, real nats-server, real signals."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest
from botocore.exceptions import ClientError

from core.errors import ConfigError
from core.objects import s3_client
from core.settings import Settings, load
from core.streams import STREAMS
from ops.devstack import stack as devstack
from ops.devstack.objectstore import ObjectStoreServer
from ops.ports import ensure_port_free, free_port

REPO = Path(__file__).resolve().parents[3]

# -- the object store ------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ObjectStoreServer]:
    srv = ObjectStoreServer(tmp_path / "objects", secret_key="test-secret-0123456789")
    try:
        srv.start()
        yield srv
    finally:
        srv.kill()


def test_object_store_put_get_and_buckets_are_directories(store: ObjectStoreServer) -> None:
    s3 = store.client()
    s3.create_bucket(Bucket="work")
    s3.put_object(Bucket="work", Key="shards/0.bin", Body=b"shard zero")

    assert s3.get_object(Bucket="work", Key="shards/0.bin")["Body"].read() == b"shard zero"
    assert (store.data_dir / "work" / "shards" / "0.bin").read_bytes() == b"shard zero"


def test_object_store_checks_signatures(store: ObjectStoreServer) -> None:
    store.client().create_bucket(Bucket="work")
    wrong = s3_client(store.endpoint, store.access_key, "not-the-secret", retries=1)

    with pytest.raises(ClientError) as caught:
        wrong.put_object(Bucket="work", Key="x", Body=b"x")
    assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert httpx.get(f"{store.endpoint}/work/x").status_code >= 400  # anonymous: refused too


def test_object_store_presigned_urls(store: ObjectStoreServer) -> None:
    s3 = store.client()
    s3.create_bucket(Bucket="work")
    put = s3.generate_presigned_url("put_object", Params={"Bucket": "work", "Key": "up.bin"}, ExpiresIn=600)
    get = s3.generate_presigned_url("get_object", Params={"Bucket": "work", "Key": "up.bin"}, ExpiresIn=600)

    assert httpx.put(put, content=b"uploaded").status_code == 200
    assert httpx.get(get).content == b"uploaded"
    # The signature covers the key: a URL edited to point elsewhere is refused.
    assert httpx.put(put.replace("up.bin", "other.bin"), content=b"x").status_code == 403


def test_object_store_restart_keeps_objects_and_port(store: ObjectStoreServer) -> None:
    store.client().create_bucket(Bucket="work")
    store.client().put_object(Bucket="work", Key="k", Body=b"kept")
    port = store.port
    store.kill()
    store.restart()
    assert store.port == port
    assert store.client().get_object(Bucket="work", Key="k")["Body"].read() == b"kept"


def test_object_store_refuses_keys_rclone_cannot_take(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        ObjectStoreServer(tmp_path / "objects", access_key="ak")  # rclone: InvalidAccessKeyId
    with pytest.raises(ConfigError):
        ObjectStoreServer(tmp_path / "objects", secret_key="has,comma")


# -- the dev stack ---------------------------------------------------------------------------------


def _start_up(data_dir: Path, out: Path, *args: str) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.devstack", "--data-dir", str(data_dir), *args],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def _wait_ready(proc: subprocess.Popen[bytes], data_dir: Path, out: Path, timeout: float = 60) -> None:
    """Wait for stack.json to say ready (dev.env is kept between runs, so it proves nothing)."""
    deadline = time.monotonic() + timeout
    while not _ready(data_dir):
        if proc.poll() is not None:
            pytest.fail(f"up exited with {proc.returncode}:\n{out.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"up not ready in {timeout}s:\n{out.read_text()}")
        time.sleep(0.1)


def _ready(data_dir: Path) -> bool:
    try:
        return bool(json.loads((data_dir / "stack.json").read_text())["ready"])
    except (OSError, ValueError, KeyError):
        return False


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.fixture
def reap() -> Iterator[list[subprocess.Popen[bytes]]]:
    """`up` processes to clean up if a test fails half-way: SIGTERM makes them stop their children."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _ports() -> list[str]:
    return [
        "--nats-port",
        str(free_port()),
        "--s3-port",
        str(free_port()),
        "--gateway-port",
        str(free_port()),
    ]


def test_up_serves_then_sigint_stops_everything(tmp_path: Path, reap: list[subprocess.Popen[bytes]]) -> None:
    data_dir, out = tmp_path / "stack", tmp_path / "up.out"
    proc = _start_up(data_dir, out, *_ports(), "--no-services")
    reap.append(proc)
    _wait_ready(proc, data_dir, out)

    settings = load(env={}, env_file=data_dir / "dev.env")
    assert settings.data_dir == str(data_dir.absolute())
    assert {s.name for s in STREAMS} <= asyncio.run(_stream_names(settings))
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):  # dev.env has the kernel user
        asyncio.run(nats.connect(settings.nats_url, allow_reconnect=False, connect_timeout=2))
    s3 = s3_client(settings.s3_endpoint, settings.s3_access_key, settings.s3_secret_key)
    s3.create_bucket(Bucket="work")
    assert (data_dir / "objects" / "work").is_dir()
    assert settings.s3_secret_key == (data_dir / "s3.secret").read_text().strip()
    pids = [p["pid"] for p in json.loads((data_dir / "stack.json").read_text())["processes"]]
    assert len(pids) == 2 and "resontech down" in out.read_text()

    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0, out.read_text()
    assert all(_gone(pid) for pid in pids)
    assert not (data_dir / "stack.json").exists()
    assert devstack.down(data_dir) == 1  # nothing left to stop


def test_second_up_is_refused_and_down_stops_the_first(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir, out = tmp_path / "stack", tmp_path / "up.out"
    ports = _ports()
    first = _start_up(data_dir, out, *ports, "--no-services")
    reap.append(first)
    _wait_ready(first, data_dir, out)
    secret = (data_dir / "s3.secret").read_text()

    assert devstack.up(data_dir, nats_port=0, s3_port=0, gateway_port=0, services=[]) == 1
    assert "already running" in capsys.readouterr().err

    assert devstack.down(data_dir) == 0
    assert first.wait(30) == 0
    assert devstack.down(data_dir) == 1
    assert "no dev stack is running" in capsys.readouterr().err

    again = _start_up(data_dir, tmp_path / "again.out", *ports, "--no-services")
    reap.append(again)
    _wait_ready(again, data_dir, tmp_path / "again.out")
    assert (data_dir / "s3.secret").read_text() == secret  # generated once, reused
    again.send_signal(signal.SIGTERM)
    assert again.wait(30) == 0


def test_detached_up_then_down(tmp_path: Path) -> None:
    data_dir = tmp_path / "stack"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops.devstack",
            "--data-dir",
            str(data_dir),
            *_ports(),
            "--no-services",
            "--detach",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    pids = [p["pid"] for p in json.loads((data_dir / "stack.json").read_text())["processes"]]
    try:
        assert result.returncode == 0, result.stderr
        assert not any(_gone(pid) for pid in pids)
    finally:
        assert devstack.down(data_dir) == 0
    assert all(_gone(pid) for pid in pids)


def test_a_service_that_dies_is_reported_and_the_rest_keeps_running(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    data_dir, out = tmp_path / "stack", tmp_path / "up.out"
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from ops.devstack import ServiceSpec, up
        py = sys.executable
        sleep = "import os, time; print(os.environ['RESONTECH_NATS_URL']); time.sleep(600)"
        services = [
            ServiceSpec("crasher", [py, "-c", "print('about to fail'); raise SystemExit(3)"]),
            ServiceSpec("sleeper", [py, "-c", sleep]),
        ]
        ports = dict(nats_port={free_port()}, s3_port={free_port()}, gateway_port=0)
        sys.exit(up(Path({str(data_dir)!r}), services=services, **ports))
        """
    )
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT
        )
    reap.append(proc)
    _wait_ready(proc, data_dir, out)
    deadline = time.monotonic() + 20
    while "crasher exited with code 3" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)

    text = out.read_text()
    assert "crasher exited with code 3" in text and "about to fail" in text
    sleeper = next(
        p for p in json.loads((data_dir / "stack.json").read_text())["processes"] if p["name"] == "sleeper"
    )
    assert not _gone(sleeper["pid"])
    url = load(env={}, env_file=data_dir / "dev.env").nats_url
    assert url in (data_dir / "logs" / "sleeper.log").read_text()  # services get the dev.env settings

    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert _gone(sleeper["pid"])


def test_start_up_failure_stops_what_had_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def broken(settings: Settings) -> None:
        raise RuntimeError("no streams today")

    monkeypatch.setattr(devstack, "_ensure_streams", broken)
    nats_port, s3_port = free_port(), free_port()

    assert (
        devstack.up(tmp_path / "stack", nats_port=nats_port, s3_port=s3_port, gateway_port=0, services=[])
        == 1
    )

    err = capsys.readouterr().err
    assert "no streams today" in err and err.count("\n") == 1
    ensure_port_free("127.0.0.1", nats_port, "test")  # NATS and the object store are gone
    ensure_port_free("127.0.0.1", s3_port, "test")
    assert not (tmp_path / "stack" / "stack.json").exists()


def test_up_refuses_a_busy_port_or_an_unwritable_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    assert devstack.up(tmp_path / "file" / "stack", nats_port=0, s3_port=0, gateway_port=0, services=[]) == 1
    assert "is not writable" in capsys.readouterr().err

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert devstack.up(tmp_path / "stack", nats_port=port, s3_port=0, gateway_port=0, services=[]) == 1
    err = capsys.readouterr().err
    assert f"port {port}" in err and "--nats-port" in err
    assert not (tmp_path / "stack" / "nats").exists()  # refused before anything started


async def _stream_names(settings: Settings) -> set[str]:
    # the dev stack's NATS runs with auth: dev.env carries the kernel's user
    nc = await nats.connect(settings.nats_url, user=settings.nats_user, password=settings.nats_password)
    try:
        return {info.config.name for info in await nc.jetstream().streams_info()}
    finally:
        await nc.close()


def test_dev_env_is_exported_for_the_shell(tmp_path: Path) -> None:
    # `source dev.env` must reach the programs the shell starts, so every line exports.
    env_file = tmp_path / "dev.env"
    env_file.write_text(devstack._env_file_text({"RESONTECH_NATS_URL": "nats://127.0.0.1:1"}))
    show = "import os; print(os.environ['RESONTECH_NATS_URL'])"
    result = subprocess.run(
        ["bash", "-c", f'source "$1" && "{sys.executable}" -c "{show}"', "bash", str(env_file)],
        capture_output=True,
        text=True,
    )
    assert result.stdout.strip() == "nats://127.0.0.1:1", result.stderr
    assert load(env={}, env_file=env_file).nats_url == "nats://127.0.0.1:1"
