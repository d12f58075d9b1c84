"""The ``torchrun`` runtime: one node of a distributed PyTorch job (DDP, FSDP) per assignment.

The agent has fetched the job's inputs into the assignment's folder at their workspace keys
(:mod:`agent.downloads`); the runtime fetches the checkpoint to resume from, through the presigned
URL of the start command, into ``<workdir>/resume/`` (``$RESONTECH_RESUME_PATH``); a sharded
checkpoint's parts, every node's, unpacked into the folder ``<workdir>/resume/checkpoint``
(:mod:`agent.checkpoint_parts`), which ``torch.distributed.checkpoint`` loads on any world size. Then
it runs, with
the agent's own interpreter (the torch installed beside the agent)::

    python -m torch.distributed.run --nnodes N --node-rank i --nproc-per-node P \\
        --master-addr A --master-port PORT --rdzv-conf timeout=T --max-restarts 0 \\
        <workdir>/<command[0]> <command[1:]>

in the assignment's folder (so the inputs lie where their keys say), with the clean environment of
:func:`agent.runtimes.base.workload_env` plus :func:`core.rendezvous.rank_env`:
``RESONTECH_DDP_BACKEND`` (``gloo`` on CPU; ``nccl`` with GPUs, one rank per GPU of
``CUDA_VISIBLE_DEVICES``), ``RESONTECH_STRATEGY`` (``ddp`` or ``fsdp``) and ``OMP_NUM_THREADS``.

``--max-restarts 0``: torchrun does not restart a failed rank itself. The kernel restarts the whole
gang, on whichever workers are alive, from the last checkpoint (:mod:`projections.gangs`).

Node 0 first checks that its master port is free on this host; if it is not, it refuses to start
with a retryable failure, and the kernel restarts the gang at the next epoch, on another port
(:mod:`core.rendezvous`).

A failed node's log tail is the output leading up to torchrun's failure report, which holds the
rank's own traceback, rather than the report, which only names the exit code.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from agent import checkpoint_parts, downloads  # modules, not their names: both import agent.runtimes
from agent.runtimes.base import StartFailed
from agent.runtimes.process import ProcessWorkload, log_tail, prepare, spawn
from core.rendezvous import rank_env
from core.sandbox import Sandbox
from schemas.commands import Rendezvous, WorkSpec

FAILURE_REPORT = "failed (exitcode: "
"""torchrun's log line when a rank failed: the workload's own output ends just before it."""


class TorchrunRuntime:
    """Starts one torchrun node in ``sandbox`` (see the module docstring)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    async def start(self, spec: WorkSpec, workdir: Path, env: Mapping[str, str]) -> ProcessWorkload:
        """Fetch the checkpoint to resume from, check the rendezvous, start the node.

        Raises:
            StartFailed: no command or rendezvous, the checkpoint cannot be fetched, the script is
                not among the inputs; retryable when node 0's port is taken.
        """
        rdzv = spec.rendezvous
        if rdzv is None or not spec.command:
            raise StartFailed("a torchrun assignment needs a command and a rendezvous")
        prepare(workdir)
        extra = rank_env(spec, rdzv)
        if spec.resume_parts and spec.resume_step is not None:
            resume = await checkpoint_parts.fetch_set(spec.resume_parts, workdir, spec.resume_step)
            extra["RESONTECH_RESUME_PATH"] = str(resume)
        elif spec.resume_url and spec.resume_from:
            name = PurePosixPath(spec.resume_from).name
            [resume] = await downloads.fetch_all({name: spec.resume_url}, workdir / "resume")
            extra["RESONTECH_RESUME_PATH"] = str(resume)
        script = downloads.target_of(workdir, spec.command[0])
        if not script.is_file():
            raise StartFailed(f"the training script {spec.command[0]!r} is not among the job's inputs")
        if rdzv.node_rank == 0 and not port_free(rdzv.master_port):
            raise StartFailed(f"rendezvous port {rdzv.master_port} is taken on this host", retryable=True)
        argv = command(rdzv, str(script), spec.command[1:])
        env = {**env, **extra}
        return await spawn(argv, workdir, env, sandbox=self.sandbox, spec=spec, workload=TorchrunWorkload)


def command(rdzv: Rendezvous, script: str, args: list[str]) -> list[str]:
    """The torchrun argv of one node."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(rdzv.nnodes),
        "--node-rank", str(rdzv.node_rank),
        "--nproc-per-node", str(rdzv.nproc_per_node),
        "--master-addr", rdzv.master_addr,
        "--master-port", str(rdzv.master_port),
        "--rdzv-conf", f"timeout={rdzv.timeout_s}",
        "--max-restarts", "0",
        script, *args,
    ]  # fmt: skip


def port_free(port: int) -> bool:
    """True if nothing listens on ``port`` on any interface of this host."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the TCP store binds
        probe.bind(("", port))
        return True
    return False


class TorchrunWorkload(ProcessWorkload):
    """A torchrun node: a process workload whose log tail stops at torchrun's failure report."""

    def log_tail(self, n: int = 40) -> str:
        return before_report(log_tail(self.tree, 400), n)


def before_report(text: str, n: int = 40) -> str:
    """The last ``n`` lines of ``text`` up to torchrun's first failure report (included), or of all
    of it when there is none."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if FAILURE_REPORT in line:
            return "\n".join(lines[max(0, index + 1 - n) : index + 1])
    return "\n".join(lines[-n:])
