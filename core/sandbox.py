"""Every workload in a bubblewrap sandbox: tenant code sees its own directory and nothing of the host's.

(In ``core/`` because both edges run tenant code in it: the agent every workload, the kernel's
federation service a job's FL server. An agent makes its host's with :func:`agent.host.host_sandbox`.)

A workload is a stranger's code on a provider's host, beside other tenants' work and the agent that
holds the host's NATS credentials. :meth:`Sandbox.command` wraps a workload's argv in ``bwrap``
(Debian's ``bubblewrap``, the sandbox Flatpak uses; unprivileged, on user namespaces) so that it runs:

* in a mount namespace of its own, on an empty read-only root: the assignment's directory, bound at its own
  path, is the only writable place on disk; ``/usr`` (and the
  ``/bin``, ``/lib`` of merged-usr hosts), a short list of ``/etc`` files (users, name resolution,
  TLS roots, the loader cache: not ``/etc/shadow`` nor host keys), the hardware view of ``/sys``,
  the Python environment the agent runs (the interpreter, its site-packages and this project's
  packages: not the source tree around them) and the model cache are read-only; everything else
  (the agent's state directory with its enrollment and commands, other assignments, the kernel's
  data directory, home directories, ``/run``) is not there at all. ``/dev`` is a minimal one
  (null, zero, random, tty, a private ``/dev/shm``); GPU work also gets the NVIDIA device nodes;
  ``/tmp`` is a private tmpfs (:data:`TMP_BYTES`);
* in a PID namespace of its own: it sees, signals and reads the environment of its own processes
  only; ``/proc`` is that namespace's;
* in user, IPC and UTS namespaces of its own, as the unprivileged ``nobody`` (uid 65534) with no
  capabilities and ``no_new_privs`` (bwrap always sets it: no setuid binary gains anything);
* ``--die-with-parent``: if the agent dies, however it dies, the whole sandbox is killed.

Limits (:class:`core.cgroups.Limits`) come from the assignment (memory) and the agent's settings
(processes, open files): a cgroup of the workload's own where the host gives the agent one
(:mod:`core.cgroups`), and rlimits always (``RLIMIT_NOFILE``, ``RLIMIT_CORE`` 0, and without a
cgroup ``RLIMIT_DATA`` and ``RLIMIT_NPROC``), set in the child before it executes bwrap.

What it does not isolate: the network (the workload shares the host's, so it reaches what the host
reaches: the FL server, the DDP rendezvous, presigned URLs, but also the kernel's ports, which ask
for credentials it does not have, and other replicas, which ask for their key); the kernel itself (a
kernel exploit escapes any namespace); GPUs (device nodes are shared, so GPU memory and side channels
are not isolated). The README's trust model says what a production host should add.

Signals: bwrap does not forward them, and it dies of a SIGTERM at once, taking the sandbox with it.
So a graceful stop signals the sandbox's processes, not bwrap (:func:`signal_workload`), and the
exit status of a workload killed by signal N, which bwrap reports as ``128 + N``, is given as ``-N``
as for any process (:meth:`Sandbox.exit_status`).

``--unsandboxed`` (local development only) runs workloads as the agent's own processes with the same
limits; such a worker takes only its owner's work (:func:`core.placement.lanes`).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from core.cgroups import Cgroups, Limits, join

SANDBOX_UID = 65534
"""``nobody`` on Debian and most distributions: its name resolves through the bound ``/etc/passwd``
(PyTorch asks for the user's name)."""
PACKAGES = ("schemas", "core", "projections", "gateway", "agent", "ops")
"""This project's packages, bound one by one when Python finds them in a source tree (an editable
install), so that the tree around them (a dev stack's data directory, its secrets) stays out."""
PROJECT_ROOT = Path(__file__).resolve().parents[1]
ETC = (
    "passwd", "group", "nsswitch.conf", "hosts", "host.conf", "resolv.conf", "gai.conf", "services",
    "protocols", "localtime", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
    "ca-certificates.conf", "pki/tls/certs", "pki/ca-trust", "crypto-policies", "ld.so.cache",
    "ld.so.conf", "ld.so.conf.d", "alternatives", "os-release", "mime.types",
)  # fmt: skip
"""The ``/etc`` entries a workload sees (read-only): who is who, name resolution, TLS roots (not
``ssl/private``: the host's own keys, which an agent running as root would otherwise hand to its
sandbox's root-mapped user), the dynamic loader's configuration."""
SYS = ("block", "bus", "class", "dev", "devices")
"""The parts of ``/sys`` a workload sees (read-only): the hardware, as Flatpak gives it."""
MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
NVIDIA_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
CHECK_TIMEOUT_S = 30.0
TMP_BYTES = 1 << 30
"""A workload's private ``/tmp``: a tmpfs (memory, counted in its cgroup) of at most this size. Its
``TMPDIR`` points into its assignment's directory (disk), where Python's ``tempfile`` and most tools
put their files; ``/tmp`` is for those that do not look (and short Unix socket paths)."""


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How this host runs workloads.

    Attributes:
        bwrap: the ``bwrap`` executable, or ``None``: unsandboxed (local development only).
        read_only: host paths bound read-only at the same place (the Python environment, the model
            cache).
        cgroups: where workload cgroups are made, or ``None`` (rlimits only).
        processes / open_files: the host's limits per workload (memory comes from the assignment).
    """

    bwrap: str | None
    read_only: tuple[Path, ...] = ()
    cgroups: Cgroups | None = None
    processes: int = 4096
    open_files: int = 65_536
    _etc: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def for_host(
        cls,
        *,
        enabled: bool = True,
        model_cache: Path | None = None,
        cgroups: Cgroups | None = None,
        processes: int = 4096,
        open_files: int = 65_536,
    ) -> Sandbox:
        """The sandbox of this host: ``bwrap`` from PATH (``None`` when not ``enabled`` or missing:
        :func:`problem` says which), the running Python environment and ``model_cache`` read-only."""
        ro = [*python_paths(), *([model_cache] if model_cache is not None else [])]
        etc = tuple(
            (os.path.realpath(f"/etc/{name}"), f"/etc/{name}")
            for name in ETC
            if os.path.exists(f"/etc/{name}")
        )
        return cls(
            bwrap=shutil.which("bwrap") if enabled else None,
            read_only=tuple(_outermost(ro)),
            cgroups=cgroups,
            processes=processes,
            open_files=open_files,
            _etc=etc,
        )

    @property
    def isolation(self) -> str:
        """``bubblewrap``, or ``off`` (``--unsandboxed``)."""
        return "bubblewrap" if self.bwrap else "off"

    def search_path(self, env: Mapping[str, str]) -> str:
        """The ``PATH`` a workload's command is looked up on: the Python environment's scripts and
        the system's in a sandbox, the workload's own ``PATH`` otherwise."""
        if self.bwrap is None:
            return env.get("PATH", SANDBOX_PATH)
        return f"{Path(sys.prefix).absolute()}/bin:{SANDBOX_PATH}"

    def limits(self, memory_mb: int) -> Limits:
        """The limits of a workload with ``memory_mb`` of memory (0: none of its own)."""
        return Limits(memory_mb=memory_mb, processes=self.processes, open_files=self.open_files)

    def command(
        self, argv: list[str], workdir: Path, *, gpus: bool = False, hide: Iterable[Path] = ()
    ) -> list[str]:
        """``argv`` as it runs in the sandbox of ``workdir`` (unchanged when unsandboxed). ``gpus``:
        the NVIDIA device nodes are there too; ``hide``: folders inside ``workdir`` the workload sees
        empty (an empty tmpfs over each)."""
        if self.bwrap is None:
            return list(argv)
        workdir = workdir.absolute()
        args = [
            self.bwrap,
            "--die-with-parent",
            "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for name in MERGED_USR:
            path = Path("/") / name
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        for source, target in self._etc:
            args += ["--ro-bind-try", source, target]
        for name in SYS:
            args += ["--ro-bind-try", f"/sys/{name}", f"/sys/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
        if gpus:
            for dev in sorted(Path("/dev").glob("nvidia[0-9]*")) + [Path("/dev", d) for d in NVIDIA_DEVICES]:
                args += ["--dev-bind-try", str(dev), str(dev)]
        for path in self.read_only:
            args += ["--ro-bind-try", str(path), str(path)]
        args += [
            "--bind", str(workdir), str(workdir),
            *(arg for path in hide for arg in ("--tmpfs", str(path))),
            "--remount-ro", "/",
            "--chdir", str(workdir),
            "--setenv", "PATH", self.search_path({}),
            "--",
        ]  # fmt: skip
        return args + list(argv)

    def preexec(self, name: str, limits: Limits) -> Callable[[], None]:
        """What the workload's first process runs between fork and exec: join the workload's cgroups
        (made here, in the agent), set its rlimits, and die with the agent.

        Raises:
            OSError: its cgroups cannot be made.
        """
        procs = self.cgroups.create(name, limits) if self.cgroups is not None else ()
        rlimits = [(resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_CORE, 0)]
        if self.cgroups is None:
            rlimits.append((resource.RLIMIT_NPROC, limits.processes))
            if limits.memory_mb:
                rlimits.append((resource.RLIMIT_DATA, limits.memory_mb * 1024 * 1024))

        def child() -> None:
            join(procs)
            for kind, value in rlimits:
                _, hard = resource.getrlimit(kind)
                capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(kind, (capped, capped))
            _die_with_parent()

        return child

    def release(self, name: str) -> None:
        """Kill what is left of workload ``name`` and remove its cgroups."""
        if self.cgroups is not None:
            self.cgroups.remove(name)

    def exit_status(self, code: int) -> int:
        """A workload's exit status as for a plain process: bwrap reports death by signal N as
        ``128 + N``."""
        if self.bwrap is not None and 128 < code < 128 + signal.NSIG:
            return -(code - 128)
        return code


def signal_workload(pgid: int, sig: signal.Signals, *, sandboxed: bool) -> None:
    """Send ``sig`` to workload group ``pgid``. A sandboxed workload's group leader is bwrap, which
    a SIGTERM kills at once with the whole sandbox: it gets only SIGKILL, and its other members
    (the workload's processes) get the rest."""
    if not sandboxed or sig == signal.SIGKILL:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        return
    for pid in group_members(pgid):
        if pid != pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def python_paths(path: Iterable[str] | None = None) -> list[Path]:
    """The running Python environment: the interpreter's prefix, the virtual environment, and the
    import path's ``site-packages`` (a shared install's too); of this project's source tree (an
    editable install), only its packages. Never another entry of the import path: the first is the
    directory the agent was started from, which may be anything (``/tmp``, a home directory)."""
    prefixes = [Path(sys.base_prefix).resolve(), Path(sys.prefix).absolute(), Path(sys.prefix).resolve()]
    paths = list(prefixes)
    for entry in sys.path if path is None else path:
        if not entry or not os.path.isdir(entry):
            continue
        resolved = Path(entry).resolve()
        if resolved == PROJECT_ROOT:
            paths += [resolved / p for p in PACKAGES if (resolved / p).is_dir()]
        elif resolved.name in ("site-packages", "dist-packages"):
            paths.append(resolved)
    return paths


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without those inside another (binding the outer one binds them too)."""
    unique = sorted(set(paths))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return kept


def problem(sandbox: Sandbox) -> str | None:
    """Why workloads cannot run in ``sandbox`` on this host, or ``None``: the one check that counts is
    starting one (bwrap missing, user namespaces off, a read-only path that cannot be bound)."""
    if sandbox.bwrap is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    with tempfile.TemporaryDirectory(prefix="rt-sandbox-check-") as tmp:
        workdir = Path(tmp)
        (workdir / "tmp").mkdir()
        argv = sandbox.command([sys.executable, "-c", "import agent.protocol"], workdir)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=_check_env()
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap cannot start: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit status {done.returncode}"
        hint = (
            " (are unprivileged user namespaces enabled? try: unshare -Ur true)"
            if "namespace" in detail
            else ""
        )
        return f"bubblewrap cannot start a workload: {detail}{hint}"
    return None


def _check_env() -> Mapping[str, str]:
    return {"PATH": os.environ.get("PATH", SANDBOX_PATH), "LANG": "C.UTF-8"}


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the agent dies (``PR_SET_PDEATHSIG``)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
