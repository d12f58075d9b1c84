"""The local nats-server: starts for real, survives SIGKILL with its data, fails clearly."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from ops.devstack.natsserver import NatsServer
from ops.ports import PortInUse, ensure_port_free, free_port
from ops.process import ServerStartError


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    srv = NatsServer(tmp_path / "nats")
    try:
        yield srv
    finally:
        srv.kill()


def test_starts_on_a_free_port_with_jetstream(server: NatsServer) -> None:
    server.start()

    async def stream_count() -> int:
        nc = await nats.connect(server.url)
        try:
            return (await nc.jetstream().account_info()).streams
        finally:
            await nc.close()

    assert server.running and server.port != 0
    assert server.url == f"nats://127.0.0.1:{server.port}"
    assert asyncio.run(stream_count()) == 0
    config = server.config_file.read_text()
    assert "sync_interval: always" in config and "max_payload: 8MB" in config


def test_sigkill_then_restart_keeps_acknowledged_messages(server: NatsServer) -> None:
    server.start()
    port = server.port

    async def publish() -> int:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="CRASH", subjects=["crash.>"])
            return (await js.publish("crash.one", b"survives")).seq
        finally:
            await nc.close()

    async def read(seq: int) -> bytes:
        nc = await nats.connect(server.url)
        try:
            return (await nc.jetstream().get_msg("CRASH", seq)).data or b""
        finally:
            await nc.close()

    seq = asyncio.run(publish())
    server.kill()
    assert not server.running
    server.restart()
    assert server.port == port
    assert asyncio.run(read(seq)) == b"survives"


def test_stop_is_graceful(server: NatsServer) -> None:
    server.start()
    server.stop()
    assert not server.running
    assert server._proc is not None and server._proc.returncode == 0
    assert "Server Exiting" in server.log_file.read_text()
    ensure_port_free("127.0.0.1", server.port, "the next test")


def test_port_in_use_is_refused_before_starting(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        srv = NatsServer(tmp_path / "nats", port=port)
        with pytest.raises(PortInUse) as caught:
            srv.start()
    message = str(caught.value)
    assert f"port {port}" in message and "nats-server" in message and "\n" not in message
    assert caught.value.code == "port_in_use"
    assert srv.pid is None


def test_unwritable_store_dir_is_refused_before_starting(tmp_path: Path) -> None:
    # A regular file where a parent directory should be: unwritable even for root.
    (tmp_path / "not-a-dir").write_text("")
    srv = NatsServer(tmp_path / "not-a-dir" / "nats", config_dir=tmp_path)
    with pytest.raises(ServerStartError, match=r"JetStream store dir .* is not writable") as caught:
        srv.start()
    assert caught.value.code == "server_start" and "\n" not in str(caught.value)
    assert srv.pid is None


def test_early_exit_quotes_the_log_and_leaves_no_process(tmp_path: Path) -> None:
    srv = NatsServer(tmp_path / "nats", max_memory="lots")
    with pytest.raises(ServerStartError, match="exited during start-up") as caught:
        srv.start()
    message = str(caught.value)
    assert "max_mem_store" in message  # the server's own complaint, quoted from its log
    assert "\n" not in message
    assert srv.pid is not None and not srv.running


def test_not_ready_in_time_leaves_no_process(tmp_path: Path) -> None:
    srv = NatsServer(tmp_path / "nats")
    with pytest.raises(ServerStartError, match="was not ready within 0s"):
        srv.start(timeout=0)
    assert srv.pid is not None and not srv.running


def test_free_port_is_bindable() -> None:
    port = free_port()
    ensure_port_free("127.0.0.1", port, "test")
