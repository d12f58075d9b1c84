"""One job's federation on this host: provisioning, the FL server process, and the kernel's admin
session on it.

Layout of ``<data dir>/federations/<tenant>/<job_id>/`` (everything NVFlare writes stays in it)::

    prov/<project>/prod_00/<host>/                  the FL server's workspace (startup kit, logs)
    prov/<project>/prod_00/kernel@resontech.local/  the kernel's admin kit
    prov/<project>/prod_00/site-N/                  each client's kit (zipped into the private kits/)
    jobs/                the FL server's job store (each run's status and its clients' error logs)
    initial/             the tenant's initial model (written beneath the folder's fd, no links)
    rounds/              the global model of every round, as the server writes it

The sandboxed server writes all of it, so the kernel reads it only beneath a directory fd, without
following links (:class:`core.files.TenantTree`), and keeps its own files in a private directory
the sandbox never sees, ``<data dir>/federations-kernel/<tenant>/<job_id>/``::

    project.yml          what was provisioned (its name, host and port: read once, reused after a
                         restart; a server that rewrote a copy in its tree would move the kernel's
                         admin kit path and its sandbox's hidden folder)
    kits/site-N.zip      each client's kit, zipped once right after provisioning (re-uploaded after
                         a service restart from here, never from the server's tree)
    federation.id        the handover archive it came from or was published as
    tmp/                 the handover archive while it is written or read
    job/                 the tenant's training code, fetched once
    runs/<n>/            each run's generated NVFlare job folder (the admin session uploads it)
    server.log           the FL server's output
    server.pid           its pid, for people (the kernel finds its processes by their tag)

Commands start with ``sys.executable`` (never a ``python3`` from PATH, as NVFlare's start scripts
do), with a clean environment (:func:`clean_env`) whose ``HOME`` is the federation directory (so
nothing lands in ``~/.nvflare``), tagged ``RESONTECH_FEDERATION=<tenant>/<job_id>`` so that the
server's whole process tree (NVFlare starts each run's process in a session of its own) can be found
and stopped.

The tenant's code runs in the server (a ``persistor``, a job folder's server components: NVFlare's
run process inherits the server's environment and works in the server's workspace), so the server
runs in the same bubblewrap sandbox as a workload on an agent's host (:mod:`core.sandbox`): the
federation's directory is the only place it sees and writes, minus the kernel's admin kit (an empty
directory over it); the kernel's data directory, its credentials, every other job and the host's
home directories are not there; the Python environment is read-only; it sees only its own
processes. A kernel host that cannot start the sandbox runs no federation: the job fails with the
reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from core import flare
from core.errors import ResontechError
from core.files import TenantTree, UnsafeFile
from core.proctags import marked
from core.sandbox import Sandbox
from core.sandbox import problem as sandbox_problem
from ops.ports import free_port
from ops.process import log_tail, spawn

log = logging.getLogger("resontech.federation")
T = TypeVar("T")
TAG = "RESONTECH_FEDERATION"
PROVISION_TIMEOUT_S = 120.0
SESSION_TIMEOUT_S = 30.0
"""Bound on every admin call (NVFlare's own command time-out is 10 s, but a dead server can hang a
connect): past it, the session is dropped and a new one is made."""


class FederationError(ResontechError):
    """Provisioning or running a federation failed; the message says why in one line."""

    code = "federation"


@dataclass(frozen=True)
class Provisioned:
    """Paths and address of a provisioned federation."""

    root: Path
    host: str
    port: int
    sites: list[str]
    private: Path
    """The kernel's own directory of this federation (``project.yml``, the kits)."""
    name: str
    """The project's name, from the kernel's ``project.yml``."""

    @property
    def prod(self) -> Path:
        return self.root / self.relative_prod

    @property
    def relative_prod(self) -> str:
        """:attr:`prod` relative to :attr:`root` (to read beneath the federation's fd)."""
        return f"prov/{self.name}/prod_00"

    @property
    def server_dir(self) -> Path:
        return self.prod / self.host

    @property
    def admin_dir(self) -> Path:
        return self.prod / flare.ADMIN_USER

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def kit_zip(self, site: str) -> Path:
        return self.private / "kits" / f"{site}.zip"


def clean_env(root: Path, tag: str) -> dict[str, str]:
    """The environment of NVFlare processes: nothing of the kernel's (no NATS or S3 credentials, no
    provider keys): a ``PATH``, a locale, ``HOME`` and ``TMPDIR`` inside ``root``, and the tag."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": str(root),
        "TMPDIR": str(root / "tmp"),
        "PYTHONUNBUFFERED": "1",
        TAG: tag,
    }


def provision(
    root: Path, private: Path, *, tenant: str, job_id: str, host: str, sites: list[str]
) -> Provisioned:
    """Provision the job's federation into ``root`` (its ``project.yml`` and client kits into the
    kernel's ``private`` directory), once: a second call returns the first result (the clients'
    certificates must outlive a kernel restart).

    Raises:
        FederationError: ``nvflare provision`` failed (the message quotes its last lines).
    """
    found = provisioned_in(root, private, sites)
    if found is not None:
        return found
    shutil.rmtree(root, ignore_errors=True)
    clear_private(private)
    (root / "tmp").mkdir(parents=True)
    project_file = private / "project.yml"
    port = free_port("127.0.0.1" if host == "localhost" else "0.0.0.0")
    name = flare.project_name(tenant, job_id)
    project_file.write_text(yaml.safe_dump(flare.project(name, host=host, port=port, sites=sites)))
    argv = [
        sys.executable,
        "-m",
        "nvflare.cli",
        "provision",
        "-p",
        str(project_file),
        "-w",
        str(root / "prov"),
    ]
    try:
        done = subprocess.run(
            argv,
            cwd=root,
            env=clean_env(root, f"{tenant}/{job_id}"),
            capture_output=True,
            timeout=PROVISION_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise FederationError(f"nvflare provision did not finish in {PROVISION_TIMEOUT_S:.0f}s") from None
    provisioned = Provisioned(root=root, host=host, port=port, sites=sites, private=private, name=name)
    if done.returncode != 0 or not provisioned.server_dir.is_dir():
        tail = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()[-5:]
        raise FederationError(f"nvflare provision failed: {' | '.join(tail)}")
    configure_server(provisioned)
    kits = private / "kits"
    kits.mkdir(mode=0o700)
    with federation_tree(root) as tree:
        for site in sites:
            zip_beneath(tree, f"{provisioned.relative_prod}/{site}", provisioned.kit_zip(site))
    return provisioned


def clear_private(private: Path) -> None:
    """Forget what the kernel kept of an earlier federation in ``private`` (its project, kits and
    archive id); its job code and run folders are remade by their own steps."""
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in ("project.yml", "federation.id"):
        (private / name).unlink(missing_ok=True)
    shutil.rmtree(private / "kits", ignore_errors=True)


def provisioned_in(root: Path, private: Path, sites: list[str]) -> Provisioned | None:
    """The federation already provisioned in ``root`` (with its client kits), if there is one: as
    the kernel's own ``project.yml`` says, never a file of the server's tree."""
    project_file = private / "project.yml"
    if not (project_file.exists() and (private / "kits").is_dir() and root.is_dir()):
        return None
    try:
        project = yaml.safe_load(project_file.read_bytes()[:MAX_PROJECT_BYTES])
        server = project["participants"][0]
        return Provisioned(
            root=root,
            host=str(server["name"]),
            port=int(server["fed_learn_port"]),
            sites=sites,
            private=private,
            name=str(project["name"]),
        )
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError):
        raise FederationError(f"{project_file} does not describe a federation") from None


MAX_PROJECT_BYTES = 1 << 20
MAX_KIT_FILE_BYTES = 64 << 20
"""A startup kit's files are certificates and configurations: kilobytes."""


def federation_tree(root: Path) -> TenantTree:
    """The federation's directory, held by an fd (the sandboxed server writes it).

    Raises:
        FederationError: it is a link or not a folder.
    """
    try:
        return TenantTree.open(root)
    except UnsafeFile as exc:
        raise FederationError(f"the federation's directory: {exc.message}") from None


def configure_server(p: Provisioned) -> None:
    """Write the FL server's ``local/resources.json`` for where the federation lives now (its job
    store is an absolute path inside ``p.root``), beneath the federation's fd (the server's
    workspace is the server's to write: a link there is refused, never followed).

    Raises:
        FederationError: the workspace holds a link or an unreadable default.
    """
    local = f"{p.relative_prod}/{p.host}/local"
    try:
        with federation_tree(p.root) as tree:
            default = json.loads(tree.read_bytes(f"{local}/resources.json.default", MAX_PROJECT_BYTES))
            resources = flare.server_resources(default, jobs_dir=str(p.jobs_dir))
            tree.write_bytes(f"{local}/resources.json", json.dumps(resources, indent=2).encode())
    except UnsafeFile as exc:
        raise FederationError(f"the FL server's workspace: {exc.message}") from None
    except ValueError:
        raise FederationError("the FL server's resources.json.default is not JSON") from None


def zip_beneath(
    tree: TenantTree, folder: str, dest: Path, *, skip: Callable[[str], bool] | None = None
) -> None:
    """Zip the regular files beneath ``folder`` of ``tree`` into ``dest`` (a kernel path), each read
    beneath the tree's fd (links left out, never followed; hard links and huge files refused).

    Raises:
        FederationError: a file is not a plain file of the tree.
    """
    try:
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in tree.files(folder):
                if skip is not None and skip(name):
                    continue
                archive.writestr(name, tree.read_bytes(f"{folder}/{name}", MAX_KIT_FILE_BYTES))
    except UnsafeFile as exc:
        dest.unlink(missing_ok=True)
        raise FederationError(f"the federation's {folder}: {exc.message}") from None


class FlareServer:
    """The federation's FL server process (NVFlare's ``server_train``, run directly with our Python).

    Args:
        provisioned: the federation.
        tag: the value of the ``RESONTECH_FEDERATION`` tag on its processes.
    """

    def __init__(self, provisioned: Provisioned, tag: str, private: Path) -> None:
        self.p = provisioned
        self.tag = tag
        # outside the federation's directory, which the sandboxed server writes: a link it left in
        # place of its log would make the kernel append the server's output to a file of its own
        self.log_file = private / "server.log"
        self.pid_file = private / "server.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def started(self) -> bool:
        """Started and not killed since (it may have died: :meth:`alive`)."""
        return self.proc is not None

    def start(self) -> None:
        """Start it, first killing whatever an earlier kernel process left of this federation."""
        self.kill()
        ws = self.p.server_dir
        argv = [
            sys.executable, "-u", "-m", "nvflare.private.fed.app.server.server_train",
            "-m", str(ws), "-s", "fed_server.json",
            "--set", "secure_train=true", f"org={flare.ORG}", "config_folder=config",
        ]  # fmt: skip
        env = clean_env(self.p.root, self.tag)
        Path(env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
        self.proc = spawn(sandboxed(argv, self.p), self.log_file, env, cwd=ws)
        self.pid_file.write_text(str(self.proc.pid))
        log.info(
            "FL server of %s started on %s:%d (pid %d)", self.tag, self.p.host, self.p.port, self.proc.pid
        )

    def alive(self) -> bool:
        """Whether the server process runs."""
        return self.proc is not None and self.proc.poll() is None

    def exit_reason(self) -> str:
        """How it ended, with the last lines of its log."""
        code = self.proc.poll() if self.proc is not None else None
        tail = " | ".join(log_tail(self.log_file, 3))
        return f"FL server exited with status {code}: {tail}"

    def kill(self) -> None:
        """SIGKILL the server and every process of this federation (its runs' processes too)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        kill_federation(self.p.root, self.tag)


def kill_federation(root: Path, tag: str) -> list[int]:
    """SIGKILL every process of the federation in ``root``: tagged ``tag`` and with ``HOME`` there.
    Only this service's: another instance on this host may serve the same job from a directory of
    its own (it took the job over), and its processes are not ours to kill."""
    marks = {f"{TAG}={tag}".encode(), f"HOME={root}".encode()}
    pids = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and int(pid) != os.getpid() and marked(pid, marks)
    ]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


@functools.cache
def kernel_sandbox() -> Sandbox:
    """The sandbox the FL servers of this kernel process run in (checked once).

    Raises:
        FederationError: it cannot start on this host.
    """
    sandbox = Sandbox.for_host()
    problem = sandbox_problem(sandbox)
    if problem is not None:
        raise FederationError(f"cannot sandbox the FL server on the kernel's host: {problem}")
    return sandbox


def sandboxed(argv: list[str], p: Provisioned) -> list[str]:
    """``argv`` in the sandbox of federation ``p``: its directory, without the kernel's admin kit."""
    return kernel_sandbox().command(argv, p.root, hide=[p.admin_dir])


class FlareAdmin:
    """The kernel's admin session on one federation: NVFlare's Session API, which blocks, run on one
    thread of its own; every call has a time limit, after which the session is dropped.

    Args:
        admin_dir: the admin startup kit (:attr:`Provisioned.admin_dir`).
    """

    def __init__(self, admin_dir: Path) -> None:
        self.admin_dir = admin_dir
        self._session: Any = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def connected(self) -> bool:
        return self._session is not None

    async def connect(self, timeout: float = 10.0) -> None:
        """Log in as :data:`core.flare.ADMIN_USER`.

        Raises:
            FederationError: the server did not answer in time.
        """
        from nvflare.fuel.flare_api.flare_api import new_secure_session

        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="flare-admin")
        try:
            self._session = await self._run(
                lambda: new_secure_session(flare.ADMIN_USER, str(self.admin_dir), timeout=timeout),
                timeout + 5,
            )
        except Exception:
            self.drop()
            raise

    async def call(self, what: Callable[[Any], T], timeout: float = SESSION_TIMEOUT_S) -> T:
        """Run ``what(session)``; on any failure the session is dropped (the next call reconnects).

        Raises:
            FederationError: not connected, timed out, or NVFlare raised.
        """
        session = self._session
        if session is None:
            raise FederationError("no admin session")
        try:
            return await self._run(lambda: what(session), timeout)
        except Exception:
            self.drop()
            raise

    async def _run(self, fn: Callable[[], T], timeout: float) -> T:
        assert self._pool is not None
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise FederationError(f"the FL server's admin port did not answer in {timeout:.0f}s") from None
        except FederationError:
            raise
        except Exception as exc:
            raise FederationError(f"admin call failed: {type(exc).__name__}: {exc}") from exc

    def drop(self) -> None:
        """Forget the session, closing it in the background (a dead server can make close hang)."""
        session, pool = self._session, self._pool
        self._session = self._pool = None
        if pool is None:
            return
        if session is not None:
            with contextlib.suppress(Exception):
                pool.submit(session.close)
        pool.shutdown(wait=False, cancel_futures=False)
