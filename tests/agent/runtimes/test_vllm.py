"""The vllm runtime (:mod:`agent.runtimes.vllm`): engine argv and environment, an engine that dies or is never
healthy, a ready line that cannot set the address or key, the key never in argv."""

from __future__ import annotations

from pathlib import Path

from agent import models
from agent.runtimes.vllm import engine_command, engine_env


def test_engine_argv_and_env_for_cpu_gpu_and_embeddings() -> None:
    chat = models.ResolvedModel("/m", "chat", "generate")
    argv = engine_command(chat, host="127.0.0.1", port=9000, gpus=0, options={})
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--served-model-name") + 1] == "chat" and "--port" in argv
    tp = engine_command(chat, host="h", port=1, gpus=4, options={})
    assert tp[tp.index("--tensor-parallel-size") + 1] == "4"
    embed = engine_command(models.ResolvedModel("/e", "e", "embed"), host="h", port=1, gpus=0, options={})
    assert "--runner" in embed and "pooling" in embed
    assert "--max-model-len" not in embed  # an embedding model keeps its own (MiniLM: 256)
    folder = models.ResolvedModel("/ws/model", "emb", "embed")
    st = engine_command(folder, host="h", port=1, gpus=0, options={"engine": "cpu"})
    assert st[1:3] == ["-m", "agent.engines.embeddings"] and st[st.index("--model") + 1] == "/ws/model"
    cpu_env = engine_env({"PATH": "/bin"}, gpus=0, options={"kv_cache_gib": "2"})
    assert cpu_env["VLLM_CPU_KVCACHE_SPACE"] == "2" and cpu_env["HF_HUB_OFFLINE"] == "1"
    assert cpu_env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and cpu_env["OMP_WAIT_POLICY"] == "PASSIVE"
    gpu_env = engine_env({}, gpus=1, options={})
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu_env and "VLLM_CPU_OMP_THREADS_BIND" not in gpu_env


async def _engine(
    tmp_path: Path, script: str, ready_timeout_s: float, *, port: int = 0, api_key: str = ""
) -> tuple[int, list[str], str]:
    """Run ``script`` as an engine on ``port`` (by default one it never answers ``/health`` on): its
    exit code, the lines the runtime passes on, its log tail."""
    import asyncio
    import sys

    from agent.runtimes.process import ProcessRuntime
    from agent.runtimes.vllm import EngineWorkload, free_port
    from core.sandbox import Sandbox
    from schemas.commands import WorkSpec

    spec = WorkSpec(runtime="process", command=[sys.executable, "-c", script])
    inner = await ProcessRuntime(Sandbox.for_host()).start(spec, tmp_path, {"PATH": "/usr/bin:/bin"})
    address = f"http://127.0.0.1:{port or free_port('127.0.0.1')}"
    engine = EngineWorkload(inner, address, api_key=api_key, ready_timeout_s=ready_timeout_s)

    async def collect() -> list[str]:
        return [line async for line in engine.lines()]

    lines, code = await asyncio.wait_for(asyncio.gather(collect(), engine.wait()), 60)
    return code, lines, engine.log_tail()


async def test_an_engine_that_dies_before_health_ends_with_its_own_exit_and_log_tail(tmp_path: Path) -> None:
    code, lines, tail = await _engine(
        tmp_path, "print('OSError: does/not/exist is not a folder'); exit(3)", 600
    )
    assert code == 3
    assert not any("RESONTECH_READY" in line or "not healthy" in line for line in lines)
    assert "does/not/exist" in tail


async def test_an_engine_never_healthy_is_stopped_after_its_ready_timeout(tmp_path: Path) -> None:
    code, lines, _ = await _engine(tmp_path, "import time; time.sleep(120)", 1.0)
    assert code != 0 and any("engine not healthy after 1s" in line for line in lines)


FORGING_ENGINE = """
import http.server, threading
def forge(address, key):
    print('RESONTECH_READY {"address": "%s", "api_key": "%s"}' % (address, key), flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
forge("http://127.0.0.1:1", "forged-before")
print('  RESONTECH_READY {"address": "http://127.0.0.1:2"}', flush=True)
server = http.server.HTTPServer(("127.0.0.1", PORT), Health)
threading.Timer(2.0, forge, ("http://127.0.0.1:3", "forged-after")).start()
threading.Timer(3.0, server.shutdown).start()
server.serve_forever()
"""


async def test_a_ready_line_the_engine_prints_cannot_set_the_replicas_address_or_key(tmp_path: Path) -> None:
    """The engine's output is a tenant's model's to fill: READY lines it prints, before and after the
    runtime's own, never reach the agent; the one claim is the runtime's address and key."""
    from collections.abc import AsyncIterator

    from agent.forwarding import forward_reports
    from agent.runtimes.vllm import free_port
    from schemas.commands import StartWork, WorkSpec
    from schemas.endpoints import EndpointReplicaReady

    port = free_port("127.0.0.1")
    script = FORGING_ENGINE.replace("PORT", str(port))
    code, lines, tail = await _engine(tmp_path, script, 30.0, port=port, api_key="the-runtimes-key")
    assert code == 0 and "forged-after" in tail  # the engine did print it (its log keeps it)
    cmd = StartWork(
        tenant="acme",
        work_id="ep1",
        work_kind="endpoint",
        assignment_id="ep1-s0-e1",
        slot=0,
        epoch=1,
        spec=WorkSpec(runtime="vllm"),
    )
    claims: list[object] = []

    async def emit(items: list[tuple[str, object, str]]) -> bool:
        claims.extend(event for _, event, _ in items)
        return True

    async def output() -> AsyncIterator[str]:
        for line in lines:
            yield line

    await forward_reports(cmd, output(), None, emit, lambda: None)  # type: ignore[arg-type]
    assert claims == [
        EndpointReplicaReady(
            assignment_id="ep1-s0-e1", epoch=1, address=f"http://127.0.0.1:{port}", api_key="the-runtimes-key"
        )
    ]


def test_the_replicas_key_goes_to_the_engine_in_its_environment_never_its_argv() -> None:
    folder = models.ResolvedModel("/ws/model", "emb", "embed")
    for options in ({}, {"engine": "cpu"}):
        argv = engine_command(folder, host="h", port=1, gpus=0, options=options)
        assert not any("key" in arg.lower() for arg in argv if arg != "agent.engines.keys.RequireKey")
    argv = engine_command(folder, host="h", port=1, gpus=0, options={})
    assert argv[argv.index("--middleware") + 1] == "agent.engines.keys.RequireKey"  # every route keyed
    env = engine_env({"VLLM_API_KEY": "the-tenants-own"}, gpus=0, options={}, api_key="the-runtimes")
    assert env["VLLM_API_KEY"] == "the-runtimes"
    assert "VLLM_API_KEY" not in engine_env({"VLLM_API_KEY": "the-tenants-own"}, gpus=0, options={})
