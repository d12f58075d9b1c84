"""The ``nvflare-client`` runtime: one NVFlare client of a federated job's federation.

The assignment brings everything (the ``WorkSpec`` of
:func:`ops.coordinator.workspecs.federated_spec`), and the agent
has fetched its downloads into the working dir before the start (:mod:`agent.downloads`):

* :data:`KIT_FILE`, the slot's client startup kit (its certificate and key), unpacked into
  ``<workdir>/kit``; the slot's shard ZIP, if the job has shards, fetched under its workspace key
  (``options["shard"]``), unpacked into ``<workdir>/data``, the ``RESONTECH_DATA_ROOT`` the training
  script reads (without a shard that folder is empty). Both ZIPs are deleted once unpacked. A shard
  that cannot be fetched or unpacked fails the start with a message that names it.
* ``options``: ``site`` (the NVFlare identity, ``site-N``; a replacement for a lost worker gets the same
  one), ``rounds`` and ``local_epochs`` (given to the script as ``RESONTECH_ROUNDS`` and
  ``RESONTECH_LOCAL_EPOCHS``).

The client is NVFlare's ``client_train`` run with the agent's own Python (never a ``python3`` from
PATH, as NVFlare's start scripts do), in the workload's clean environment and sandbox. It dies with
the agent, as every workload does: a client that outlived its agent would hold the site's identity
that the replacement takes over. NVFlare runs the script in a job process of its own session; like any
workload's, the whole tree is found by its marks and killed when the client ends or is stopped
(:func:`agent.runtimes.process.kill_marked`).

NVFlare prefixes what the script prints with its log format, so a ``RESONTECH_PROGRESS {...}`` the
script prints arrives mid-line: :func:`protocol_line` cuts the prefix off, and the agent turns it into
a ``progress`` event (round, epoch, loss) as for any workload.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from agent.archives import BadArchive, unpack
from agent.protocol import PROGRESS
from agent.runtimes.base import StartFailed
from agent.runtimes.process import ProcessWorkload, prepare, spawn
from core.flare import KIT_FILE, ORG
from core.sandbox import Sandbox
from schemas.commands import WorkSpec


def protocol_line(line: str) -> str:
    """``line`` from its ``RESONTECH_PROGRESS`` on, if it has one; else unchanged."""
    at = line.find(PROGRESS + " ")
    return line[at:] if at > 0 else line


def client_argv(kit: Path, site: str) -> list[str]:
    """NVFlare's client, run directly with this Python, from the unpacked kit."""
    return [
        sys.executable, "-u", "-m", "nvflare.private.fed.app.client.client_train",
        "-m", str(kit), "-s", "fed_client.json",
        "--set", "secure_train=true", f"uid={site}", f"org={ORG}", "config_folder=config",
    ]  # fmt: skip


def _unpack(workdir: Path, shard: str) -> None:
    archives = [(KIT_FILE, workdir / "kit", "the startup kit")]
    if shard:
        archives.append((shard, workdir / "data", f"shard {shard}"))
    for name, dest, what in archives:
        archive = workdir / name
        unpack(archive, dest, what)
        archive.unlink()


class NvflareClientRuntime:
    """Starts an NVFlare client from the assignment's kit (and shard, if any) in ``sandbox`` (see the
    module docstring)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    async def start(self, spec: WorkSpec, workdir: Path, env: Mapping[str, str]) -> ProcessWorkload:
        site, shard = spec.options.get("site", ""), spec.options.get("shard", "")
        if not site or set(spec.downloads) != {KIT_FILE, shard} - {""}:
            raise StartFailed(
                f"an nvflare-client assignment needs a site, its {KIT_FILE} and its shard (if it has one)"
            )
        prepare(workdir)
        try:
            await asyncio.to_thread(_unpack, workdir, shard)
        except BadArchive as exc:
            raise StartFailed(exc.message) from None
        client_env = dict(env)
        client_env.update(
            RESONTECH_SITE=site,
            RESONTECH_ROUNDS=spec.options.get("rounds", ""),
            RESONTECH_LOCAL_EPOCHS=spec.options.get("local_epochs", "1"),
        )
        argv = client_argv(workdir / "kit", site)
        return await spawn(
            argv, workdir, client_env, sandbox=self.sandbox, spec=spec, workload=FlareClientWorkload
        )


class FlareClientWorkload(ProcessWorkload):
    """A running NVFlare client: a process workload whose progress lines come from behind NVFlare's
    log prefix (:func:`protocol_line`)."""

    async def lines(self) -> AsyncIterator[str]:
        async for line in super().lines():
            yield protocol_line(line)
