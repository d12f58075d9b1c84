"""Keep a nats-server's agent users in step with the PROVIDERS stream (``resontech nats-auth``).

The users of enrolled agents are derived from events: ``provider.agent_enrolled`` adds one (with the
bcrypt hash of its password), ``provider.agent_credentials_revoked`` removes it. A cluster's dispatcher
(``provider.cluster_enrolled``) is a user whose permissions grow as its nodes enroll. This service follows
the providers projection, renders the agents file (:func:`core.natsauth.agent_users`) whenever the
set of live agents changes, writes it atomically and makes the server reload it: a new agent can
connect within moments of enrolling, and a revoked one is disconnected and refused from then on.

It runs beside each nats-server (it writes a local file and signals a local process): once per node
of a cluster, each with the same log, so every node converges on the same users.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.files import write_private
from core.log import EventLog
from core.natsauth import DispatcherUser, agent_users
from core.settings import Settings
from projections import PROVIDERS
from projections.providers import ProvidersState, active_agents, active_clusters, cluster_nodes, dispatcher_id
from projections.runner import ProjectionRunner
from schemas.envelope import Recorded
from schemas.providers import (
    AgentCredentialsRevoked,
    AgentEnrolled,
    ClusterCredentialsRevoked,
    ClusterEnrolled,
)

log = logging.getLogger("resontech.natsauth")


class AgentUsersSync:
    """Follows PROVIDERS and rewrites ``agents_file``, calling ``reload`` after every change.

    ``reload`` runs in a thread and may block until the server applied the file
    (:meth:`ops.devstack.natsserver.NatsServer.reload` does).

    Attributes:
        synced_seq: the PROVIDERS sequence the file on disk reflects (0 before the first sync).
    """

    def __init__(self, event_log: EventLog, agents_file: Path, reload: Callable[[], None]) -> None:
        self.log = event_log
        self.agents_file = agents_file
        self.reload = reload
        self.synced_seq = 0
        self.synced = asyncio.Condition()
        self.first_synced = asyncio.Event()
        """Set once the file reflects the log as it was at start-up (and the server reloaded it)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Sync once caught up, then at every enrollment or revocation, until ``stop`` is set."""
        runner = ProjectionRunner(self.log, PROVIDERS, write_snapshots=False)
        changed = asyncio.Event()

        def on_record(record: Recorded[Any]) -> None:
            if isinstance(
                record.event,
                AgentEnrolled | AgentCredentialsRevoked | ClusterEnrolled | ClusterCredentialsRevoked,
            ):
                changed.set()

        runner.listeners.append(on_record)
        follow = asyncio.create_task(runner.run(stop))
        try:
            caught_up = asyncio.create_task(runner.caught_up.wait())
            await asyncio.wait({caught_up, follow}, return_when=asyncio.FIRST_COMPLETED)
            if follow.done():
                caught_up.cancel()
                follow.result()
                return
            await self.sync(runner.state, runner.seq)
            self.first_synced.set()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)
                if changed.is_set():
                    changed.clear()
                    await self.sync(runner.state, runner.seq)
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)

    async def sync(self, state: ProvidersState, seq: int) -> bool:
        """Write the agents file for ``state`` and reload the server if it changed; whether it did."""
        users = [
            (a.worker_id, a.nats_password_bcrypt) for a in active_agents(state) if a.nats_password_bcrypt
        ]
        dispatchers = [
            DispatcherUser(
                cluster=c.cluster,
                dispatcher=dispatcher_id(c.cluster),
                provider=provider,
                password_bcrypt=c.nats_password_bcrypt,
                nodes=tuple(cluster_nodes(state, provider, c)),
            )
            for provider, c in active_clusters(state)
        ]
        text = agent_users(users, dispatchers)
        try:
            current = self.agents_file.read_text()
        except FileNotFoundError:
            current = None
        if current != text:
            write_private(self.agents_file, text)
            await asyncio.to_thread(self.reload)
            log.info(
                "agent users: %d live, %d dispatchers; server reloaded (PROVIDERS seq %d)",
                len(users),
                len(dispatchers),
                seq,
            )
        async with self.synced:
            self.synced_seq = seq
            self.synced.notify_all()
        return current != text

    async def wait_synced(self, seq: int, timeout: float = 10.0) -> None:
        """Wait until the file reflects PROVIDERS up to ``seq``."""
        async with self.synced:
            await asyncio.wait_for(self.synced.wait_for(lambda: self.synced_seq >= seq), timeout)


def reload_by_pid_file(pid_file: Path) -> Callable[[], None]:
    """A ``reload`` that sends SIGHUP to the nats-server whose pid is in ``pid_file``."""

    def reload() -> None:
        try:
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGHUP)
        except (OSError, ValueError) as exc:
            log.error("cannot signal nats-server (pid file %s) to reload: %s", pid_file, exc)

    return reload


async def serve(settings: Settings, agents_file: Path, pid_file: Path) -> None:
    """Run the sync against the server of ``pid_file`` until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with await EventLog.connect(settings, name="resontech-nats-auth") as event_log:
        await AgentUsersSync(event_log, agents_file, reload_by_pid_file(pid_file)).run(stop)
