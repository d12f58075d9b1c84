"""Tenant code runs sandboxed: a hostile probe workload (:mod:`tests.support.probe`) through every
runtime finds and does nothing; the sandbox's own rules, unit by unit."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.host import host_sandbox
from agent.identity import owner_only
from agent.models import model_cache
from agent.runtimes import ProcessRuntime, StartFailed, TorchrunRuntime, workload_env
from agent.runtimes.vllm import VllmRuntime
from agent.settings import AgentSettings, default_work_dir, load_agent_settings
from core.cgroups import Limits, detect
from core.errors import ConfigError
from core.files import write_private
from core.placement.rules import lanes
from core.placement.values import Candidate
from core.sandbox import Sandbox, group_members, python_paths
from schemas.commands import Rendezvous, StartWork, WorkSpec
from schemas.workers import WorkerPolicy
from tests.support.sandbox_probe import ETC_SEEN, PROBE, digest, read_proc


def findings(lines: list[str]) -> list[list[str]]:
    """Every ``PROBE_FINDINGS`` report among a workload's output lines (one per probe that ran)."""
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("PROBE_FINDINGS ")]


def command(work_id: str, assignment_id: str, spec: WorkSpec) -> StartWork:
    return StartWork(
        tenant="acme",
        work_id=work_id,
        work_kind="job",
        assignment_id=assignment_id,
        slot=0,
        epoch=1,
        spec=spec,
    )


class Host:
    """An agent's host as the runtime tests lay it out: a state dir with its secrets, a work dir with
    another tenant's running workload, the test process holding a secret of its own."""

    def __init__(self, root: Path) -> None:
        self.state_dir = root / "agent"
        self.work = default_work_dir(self.state_dir)  # beside the state dir, as an agent lays it out
        owner_only(self.state_dir, self.work)
        self.password = secrets.token_urlsafe(24)
        write_private(self.state_dir / "enrollment.json", json.dumps({"nats_password": self.password}))
        write_private(self.state_dir / "commands.json", json.dumps({"running": {}}))
        self.kernel_dir = root / "kernel-data"
        self.kernel_dir.mkdir()
        (self.kernel_dir / "dev.env").write_text("RESONTECH_OPERATOR_KEY=secret\n")
        self.other_secret = secrets.token_urlsafe(24)
        self.settings = AgentSettings(name="probe", state_dir=str(self.state_dir), work_dir=str(self.work))
        self.sandbox, problem = host_sandbox(self.settings)
        assert problem is None, problem

    def targets(self, **extra: Any) -> dict[str, Any]:
        return {
            "absent": [
                str(self.state_dir / "enrollment.json"),
                str(self.state_dir / "commands.json"),
                str(self.work / "other"),
                str(self.kernel_dir),
                str(Path.home() / ".bash_history"),
                "/etc/shadow",
                "/etc/ssl/private",
                "/etc/ssh",
            ],
            "secrets": [digest(self.password), digest(self.other_secret)],
            "pids": [os.getpid(), os.getppid()],
            "unwritable": ["/", "/usr/lib", "/etc", sys.prefix, *map(str, self.sandbox.read_only)],
            "allowed": [str(p) for p in self.sandbox.read_only] + ETC_SEEN,
            **extra,
        }

    async def other_workload(self) -> Any:
        """Another tenant's workload on the host, sleeping, with a secret in its environment."""
        spec = WorkSpec(runtime="process", command=[sys.executable, "-c", "import time; time.sleep(120)"])
        cmd = command("other", "other", spec)
        env = workload_env(cmd, self.work / "other", gpu_indices=[])
        env["OTHER_TENANT_TOKEN"] = self.other_secret
        return await ProcessRuntime(self.sandbox).start(spec, self.work / "other", env)


async def run_probe(host: Host, spec: WorkSpec, assignment_id: str, **targets: Any) -> tuple[int, list[str]]:
    """Run the probe as ``spec`` says (its runtime), beside another tenant's workload; its exit status
    and output lines."""
    other = await host.other_workload()
    try:
        target = host.targets(pids=[os.getpid(), os.getppid(), other.pid], **targets)
        workdir = host.work / assignment_id
        workdir.mkdir(mode=0o700)
        (workdir / "probe.py").write_text(PROBE.read_text())
        spec = msgspec.structs.replace(spec, command=[*spec.command, json.dumps(target)])
        env = workload_env(command("probe", assignment_id, spec), workdir, gpu_indices=[])
        runtime = {"process": ProcessRuntime, "torchrun": TorchrunRuntime}[spec.runtime](host.sandbox)
        workload = await runtime.start(spec, workdir, env)
        lines = [line async for line in workload.lines()]
        return await workload.wait(), lines
    finally:
        await other.cancel(1.0)


async def test_a_probe_process_finds_nothing_and_does_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path)
    marker = Path("/tmp") / f"rt-probe-{secrets.token_hex(6)}"
    host_file = Path("/tmp") / f"rt-host-{secrets.token_hex(6)}"  # the host's /tmp is not its /tmp
    host_file.write_text("another user's file")
    os.environ["PROBE_TEST_SECRET"] = host.password  # the test's own process holds one too
    try:
        spec = WorkSpec(runtime="process", command=[sys.executable, "probe.py"], memory_mb=512)
        code, lines = await run_probe(
            host, spec, "a1", host_tmp_marker=str(marker), absent=[*host.targets()["absent"], str(host_file)]
        )
    finally:
        del os.environ["PROBE_TEST_SECRET"]
        host_file.unlink()
    assert findings(lines) == [[]], "\n".join(lines)
    assert code == 0
    assert not marker.exists()  # its /tmp is its own
    assert os.stat(host.state_dir).st_mode & 0o777 == 0o700
    assert {os.stat(host.state_dir / f).st_mode & 0o777 for f in ("enrollment.json", "commands.json")} == {
        0o600
    }


async def test_a_probe_torchrun_job_finds_nothing_on_any_rank(tmp_path: Path) -> None:
    from ops.ports import free_port

    host = Host(tmp_path)
    rdzv = Rendezvous(
        master_addr="127.0.0.1", master_port=free_port("127.0.0.1"), nnodes=1, node_rank=0, nproc_per_node=2
    )
    spec = WorkSpec(runtime="torchrun", command=["probe.py"], rendezvous=rdzv, cpus=2, memory_mb=4096)
    code, lines = await run_probe(host, spec, "t1")
    assert findings(lines) == [[], []], "\n".join(lines)  # both ranks
    assert code == 0


async def test_an_engine_replica_sees_only_its_own_files_and_answers_401_to_another_workload(
    tmp_path: Path,
) -> None:
    host = Host(tmp_path)
    spec = WorkSpec(runtime="vllm", options={"model": "all-minilm-l6-v2", "engine": "cpu"})
    cmd = StartWork(
        tenant="globex",
        work_id="e1",
        work_kind="endpoint",
        assignment_id="e1-r0-e1",
        slot=0,
        epoch=1,
        spec=spec,
    )
    workdir = host.work / "e1-r0-e1"
    engine = await VllmRuntime(host.sandbox).start(spec, workdir, workload_env(cmd, workdir, gpu_indices=[]))
    try:
        ready = ""
        async for line in engine.lines():
            if line.startswith("RESONTECH_READY"):
                ready = line
                break
        address = json.loads(ready.split(" ", 1)[1])["address"]
        assert_own_view(engine.pid, workdir, host)
        # A first tenant's workload on the same host calls the second tenant's replica: 401.
        spec_a = WorkSpec(runtime="process", command=[sys.executable, "probe.py"])
        code, lines = await run_probe(host, spec_a, "a1", replicas=[address])
        assert findings(lines) == [[]], "\n".join(lines)
        assert code == 0
    finally:
        await engine.cancel(2.0)


async def test_the_sandbox_kills_a_runaway_workload_at_its_memory_and_process_limits(tmp_path: Path) -> None:
    host = Host(tmp_path)
    hog = "b = []\nwhile True: b.append(bytearray(16 << 20))"
    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", hog], memory_mb=128)
    workload = await start(host.sandbox, spec, host.work / "hog")
    code = await asyncio.wait_for(workload.wait(), 60)
    assert code in (-signal.SIGKILL, 1), workload.log_tail()  # the OOM killer, or a MemoryError
    forks = (
        "import subprocess\nps = [subprocess.Popen(['sleep', '30']) for _ in range(64)]\nprint('forked all')"
    )
    sandbox = dataclasses.replace(host.sandbox, processes=32)
    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", forks])
    workload = await start(sandbox, spec, host.work / "forks")
    lines = [line async for line in workload.lines()]
    assert await workload.wait() != 0 and "forked all" not in lines, lines


async def start(sandbox: Sandbox, spec: WorkSpec, workdir: Path) -> Any:
    """``spec`` started by the process runtime in ``sandbox``, as the agent starts it."""
    env = workload_env(command(workdir.name, workdir.name, spec), workdir, gpu_indices=[])
    return await ProcessRuntime(sandbox).start(spec, workdir, env)


def assert_own_view(group: int, workdir: Path, host: Host) -> None:
    """The engine's own view of the host, read from outside through its root: its directory, and
    none of the agent's or the kernel's files; its own PID namespace; the model cache read-only."""
    argvs = {p: read_proc(p, "cmdline").split(b"\0") for p in group_members(group)}
    [pid] = [
        p for p, argv in argvs.items() if b"agent.engines.embeddings" in argv and b"bwrap" not in argv[0]
    ]
    root = Path(f"/proc/{pid}/root")
    assert (root / str(workdir).lstrip("/")).is_dir()
    for hidden in (host.state_dir / "enrollment.json", host.kernel_dir, Path.home() / ".bash_history"):
        assert not (root / str(hidden).lstrip("/")).exists(), hidden
    nspid = [line for line in read_proc(pid, "status").decode().splitlines() if line.startswith("NSpid")]
    assert len(nspid[0].split()) == 3  # a pid here and one in its own namespace
    cache = root / str(model_cache()).lstrip("/")
    if cache.is_dir():  # the converted models: the engine reads them, never writes them
        with pytest.raises(OSError):
            (cache / "poisoned").write_text("x")


async def test_rlimits_bound_a_workload_where_the_host_gives_no_cgroup(tmp_path: Path) -> None:
    host = Host(tmp_path)
    sandbox = dataclasses.replace(host.sandbox, cgroups=None, open_files=64)
    code = "import os\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', 0))\n"
    code += "except OSError: print(len(fds))"
    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", code], memory_mb=64)
    workload = await start(sandbox, spec, host.work / "rl")
    lines = [line async for line in workload.lines()]
    assert await workload.wait() == 0
    assert int(lines[-1]) < 64
    big = "try:\n    b = bytearray(256 << 20)\n    print('allocated')\n"
    big += "except MemoryError:\n    print('refused')"
    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", big], memory_mb=64)
    workload = await start(sandbox, spec, host.work / "rl2")
    assert [line async for line in workload.lines()] == ["refused"]


# -- through a real agent --------------------------------------------------------------------------


# -- the rules, unit by unit -----------------------------------------------------------------------


def test_the_sandbox_binds_the_assignment_writable_and_nothing_of_the_agent(tmp_path: Path) -> None:
    sandbox = Sandbox.for_host(model_cache=tmp_path / "models")
    workdir = tmp_path / "agent" / "work" / "a1"
    argv = sandbox.command(["python", "x.py"], workdir)
    pairs = list(zip(argv, argv[1:], argv[2:], strict=False))
    writable = [(a, b) for flag, a, b in pairs if flag == "--bind"]
    assert writable == [(str(workdir), str(workdir))]
    assert ("--ro-bind-try", str(tmp_path / "models"), str(tmp_path / "models")) in pairs
    assert not any(str(tmp_path / "agent") == a for _, a, _ in pairs)
    for flag in ("--die-with-parent", "--unshare-pid", "--unshare-user", "--unshare-ipc"):
        assert flag in argv
    assert argv[argv.index("--uid") + 1] == "65534" and argv[-2:] == ["python", "x.py"]
    assert not {"/etc/shadow", "/etc/ssl", "/etc/ssl/private", "/etc/ssh"} & set(argv)
    assert not any(a in ("/home", "/root", "/run") for a in argv)
    assert Sandbox(bwrap=None).command(["python", "x.py"], workdir) == ["python", "x.py"]


def test_the_project_tree_is_bound_package_by_package_and_the_start_directory_never(tmp_path: Path) -> None:
    from core.sandbox import PROJECT_ROOT

    paths = python_paths([str(tmp_path), "/tmp", "", str(PROJECT_ROOT), *sys.path])
    assert PROJECT_ROOT not in paths  # its data dirs and secrets stay out
    assert PROJECT_ROOT / "agent" in paths
    assert not [p for p in paths if p in (tmp_path, Path("/tmp"), Path.cwd(), Path.home())]


def test_a_signal_death_in_the_sandbox_reads_as_for_a_process() -> None:
    sandboxed, bare = Sandbox(bwrap="/usr/bin/bwrap"), Sandbox(bwrap=None)
    assert sandboxed.exit_status(128 + signal.SIGKILL) == -signal.SIGKILL
    assert sandboxed.exit_status(3) == 3 and bare.exit_status(137) == 137


def test_unsandboxed_is_for_an_owners_own_workers_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--unsandboxed runs only its owner's own work"):
        load_agent_settings(tmp_path, {"unsandboxed": True})
    ok = load_agent_settings(tmp_path, {"unsandboxed": True, "pool": "private", "owner_tenant": "acme"})
    assert ok.unsandboxed


def test_placement_gives_an_unsandboxed_worker_its_owners_work_and_a_broken_one_nothing() -> None:
    managed = Candidate(worker_id="w", pool="managed", owner_tenant="acme")
    lending = msgspec.structs.replace(managed, policy=WorkerPolicy(allowed_pools=["managed", "shared"]))
    assert lanes(lending) == (("managed", "acme", False), ("shared", "", False))  # (pool, owner, image)
    off = msgspec.structs.replace(lending, sandbox="off")
    assert lanes(off) == (("managed", "acme", False),)  # never another tenant's shared work
    assert lanes(Candidate(worker_id="w", sandbox="unavailable")) == ()
    assert lanes(Candidate(worker_id="w", sandbox="off")) == ()
    assert lanes(Candidate(worker_id="w", sandbox="bubblewrap")) == (("shared", "", False),)
    assert lanes(Candidate(worker_id="w", sandbox="kubernetes")) == (
        ("shared", "", False),
        ("shared", "", True),
    )


def test_a_host_without_bubblewrap_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    settings = AgentSettings(name="x", state_dir=str(tmp_path / "s"), work_dir=str(tmp_path / "w"))
    sandbox, problem = host_sandbox(settings)
    assert sandbox.bwrap is None and problem is not None and "bubblewrap" in problem


async def test_a_workload_cgroup_is_made_limited_and_removed(tmp_path: Path) -> None:
    cgroups = detect()
    if cgroups is None:
        pytest.skip("this host gives the agent no writable cgroup (rlimits are tested above)")
    procs = cgroups.create("unit-test", Limits(memory_mb=64, processes=16))
    assert all(p.exists() for p in procs)
    cgroups.remove("unit-test")
    assert not any(p.parent.exists() for p in procs)


def test_start_failures_name_the_missing_program(tmp_path: Path) -> None:
    sandbox = Sandbox.for_host()
    spec = WorkSpec(runtime="process", command=["no-such-program-xyz"])
    with pytest.raises(StartFailed, match="no-such-program-xyz"):
        asyncio.run(ProcessRuntime(sandbox).start(spec, tmp_path / "a", {"PATH": "/usr/bin"}))


# -- NVFlare: the client's training script and the server's tenant components --------------------


def test_agent_check_says_whether_this_host_can_sandbox(tmp_path: Path) -> None:
    import subprocess

    from tests.support import REPO

    def check(path: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": path}
        argv = [sys.executable, "-m", "ops.cli", "--data-dir", str(tmp_path), "agent", "--check"]
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    ok = check(os.environ["PATH"])
    assert ok.returncode == 0 and "ok: workloads run sandboxed" in ok.stdout, ok.stdout + ok.stderr
    assert "sandbox:  bubblewrap" in ok.stdout
    (tmp_path / "bin").mkdir()
    broken = check(str(tmp_path / "bin"))
    assert broken.returncode == 1 and "sandbox:  unavailable" in broken.stdout
    assert "bubblewrap (bwrap) is not installed" in broken.stdout and "Traceback" not in broken.stderr
