"""Enrolled agents' NATS credentials against a real nats-server with auth: each agent can publish only
its own subjects and read only its own commands, a real agent process runs a job with them, and
revoked credentials stop working. The gateway (in-process), the sync of the server's agent users and
a coordinator run for real beside it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable

import nats
import nats.errors
import nats.js.errors
import pytest

from agent import reports
from agent.enroll import load_enrollment
from agent.protocol import CheckpointLine, ProgressLine, ReadyLine
from core.errors import LogUnavailable
from core.log import EventLog
from core.natsauth import AGENT_ENDPOINT_EVENTS, AGENT_JOB_EVENTS, KERNEL_USER, agent_permissions
from core.streams import command_subject, heartbeat_subject, intake_subject
from schemas.commands import StartWork, StopWork, WorkSpec
from schemas.jobs import JobCompleted
from schemas.workers import Heartbeat, WorkerRegistered
from tests.support import AgentProcess, coordinator, of, records, wait_records
from tests.support.secured import Stack, agent_settings, raw_agent, violation
from tests.support.work import py, submit

# -- NATS subject matching, to check the permissions as pure data ----------------------------------


def matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def allowed(patterns: tuple[str, ...], subject: str) -> bool:
    return any(matches(p, subject) for p in patterns)


def test_every_claim_an_agent_makes_is_allowed_and_nothing_else() -> None:
    worker = "w-0123456789ab"
    publish = agent_permissions(worker).publish
    job = StartWork(
        assignment_id="a1",
        work_id="j1",
        work_kind="job",
        tenant="acme",
        epoch=1,
        slot=0,
        spec=WorkSpec(runtime="process", command=["true"]),
    )
    replica = StartWork(
        assignment_id="a2",
        work_id="e1",
        work_kind="endpoint",
        tenant="acme",
        epoch=1,
        slot=0,
        spec=WorkSpec(runtime="process", command=["true"]),
    )
    emitted: list[str] = []
    for cmd in (job, replica):
        emitted += [reports.started(cmd, worker)[0], reports.rejected(cmd, worker, "no")[0]]
        emitted += [reports.start_failed(cmd, "x")[0]]
        for cause, code in [("exited", 0), ("exited", 1), ("agent_stopped", None), ("agent_restarted", None)]:
            emitted += [a[0] for a in reports.ended(cmd, cause, code, worker_id=worker)]  # type: ignore[arg-type]
        part = CheckpointLine(object_key="k/node-0.tar", dir="step-1", step=1)  # a part, once uploaded
        lines = [ProgressLine(step=1), CheckpointLine(object_key="k"), part, ReadyLine(address="http://h:1")]
        emitted += [item[0] for line in lines if (item := reports.reported(cmd, line, 1))]
        tick = reports.Meter(cmd, worker_id=worker, start_ms=0).tick(10)
        assert tick is not None
        emitted.append(tick[0])
    emitted += [f"worker.{worker}.registered", f"worker.{worker}.policy_set"]
    emitted += [f"worker.{worker}.verification_reported"]
    claims = [intake_subject(worker, s) for s in emitted]  # every word of the agent is a claim
    # the permissions name exactly what agents claim: no more, no less
    assert {s.rsplit(".", 1)[1] for s in emitted if s.startswith("job.")} == {
        e.event_name() for e in AGENT_JOB_EVENTS
    }
    assert {s.rsplit(".", 1)[1] for s in emitted if s.startswith("endpoint.")} == {
        e.event_name() for e in AGENT_ENDPOINT_EVENTS
    }
    assert [s for s in [*claims, heartbeat_subject(worker)] if not allowed(publish, s)] == []
    other = "w-ffffffffffff"
    for forbidden in (
        heartbeat_subject(other),
        *emitted,  # no stream the projections fold: only the kernel writes there
        intake_subject(other, f"worker.{other}.registered"),  # a claim under another worker's id
        intake_subject(worker, f"worker.{other}.registered"),  # about another worker
        intake_subject(worker, f"worker.{worker}.uncordoned"),  # the kernel's word, not the agent's
        intake_subject(worker, f"worker.{worker}.verified"),
        intake_subject(worker, f"meter.acme.{other}.a1.tick"),
        intake_subject(worker, f"meter.acme.{worker}.a1.tokens"),  # the gateway's count
        intake_subject(worker, "endpoint.acme.e1.failed"),  # the coordinator's word
        intake_subject(worker, "job.acme.j1.submitted"),
        intake_subject(worker, "job.acme.j1.completed"),
        "tenant.acme.created",
        "provider.p.agent_enrolled",
        f"meter.acme.{worker}.a1.tick",
        "job.acme.j1.placed",
        "endpoint.acme.e1.scaled",
        command_subject(worker),
        "$JS.API.STREAM.DELETE.JOBS",
        f"JS.KERNEL.API.CONSUMER.MSG.NEXT.COMMANDS.agent-{other}",
        f"JS.KERNEL.API.CONSUMER.CREATE.COMMANDS.agent-{worker}.cmd.{other}",
        f"$JS.ACK.COMMANDS.agent-{other}.1.1.1.1.0",
    ):
        assert not allowed(publish, forbidden), forbidden
    assert agent_permissions(worker).subscribe == (f"_INBOX_{worker}.>",)


# -- what enrolled credentials may do --------------------------------------------------------------


async def test_anonymous_and_wrong_password_connections_are_refused(stack: Stack) -> None:
    for options in ({}, {"user": KERNEL_USER, "password": "wrong"}):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(stack.server.url, allow_reconnect=False, connect_timeout=2, **options)


async def test_an_enrolled_agent_publishes_its_own_heartbeat_and_nothing_of_others(stack: Stack) -> None:
    enrolled, state_dir = await stack.enroll("a1")
    other, _ = await stack.enroll("a2")
    me, them = enrolled.worker_id, other.worker_id
    async with await EventLog.connect(agent_settings(enrolled, state_dir, stack.log.settings)) as own:
        position = await own.append(heartbeat_subject(me), Heartbeat(interval_s=1.0))
        assert position.stream == "HEARTBEATS"
    async with raw_agent(enrolled) as (nc, errors):
        for subject in (
            heartbeat_subject(them),
            f"worker.{them}.registered",
            f"worker.{me}.uncordoned",
            "tenant.acme.created",
            "job.acme.j1.completed",
            f"meter.acme.{them}",
            "federation.acme.j1.claimed",  # who runs an FL server is the federation services' word
            "federation.fed-a.beat",
        ):
            await nc.publish(subject, b"{}")
            await violation(errors, subject)
        # a reply subject cannot make JetStream store its acknowledgement on a kernel stream
        await nc.publish(heartbeat_subject(me), b"{}", reply="tenant.evil.created")
        await nc.flush()
    await asyncio.sleep(0.3)
    assert await records(stack.log, "TENANTS") == []
    assert await stack.log.last_seq("HEARTBEATS", heartbeat_subject(them)) == 0
    assert await stack.log.last_seq("JOBS") == 0 and await stack.log.last_seq("WORKERS") == 0
    assert await stack.log.last_seq("FEDERATION") == 0


async def test_an_agent_cannot_hold_atomic_batches_open_on_the_stream_it_writes(stack: Stack) -> None:
    """The server keeps at most 50 unfinished atomic batches per stream for 10 s: an agent that left
    50 open on INTAKE would make the kernel's batches fail. INTAKE takes no atomic batches, so an
    agent's batch is refused outright and its claims are stored one by one, as before."""
    enrolled, _ = await stack.enroll("a1")
    me = enrolled.worker_id
    subject = intake_subject(me, f"worker.{me}.registered")
    async with raw_agent(enrolled) as (nc, _errors):
        inbox = nc.new_inbox()
        replies = await nc.subscribe(inbox)
        for number in (1, 2):
            headers = {"Nats-Batch-Id": "hostile", "Nats-Batch-Sequence": str(number)}
            if number == 2:
                headers["Nats-Batch-Commit"] = "1"
            await nc.publish(subject, b"{}", reply=inbox if number == 2 else "", headers=headers)
        answer = json.loads((await replies.next_msg(timeout=10)).data)
    assert answer["error"]["err_code"] == 10174, answer  # atomic publish is disabled


async def test_an_enrolled_agent_reads_only_its_own_commands(stack: Stack) -> None:
    enrolled, state_dir = await stack.enroll("a1")
    other, _ = await stack.enroll("a2")
    me, them = enrolled.worker_id, other.worker_id
    for worker in (me, them):
        cmd = StopWork(assignment_id=f"a-{worker}", work_id="j", epoch=1, reason="test")
        await stack.log.append(command_subject(worker), cmd)
    async with await EventLog.connect(agent_settings(enrolled, state_dir, stack.log.settings)) as own:
        async with contextlib.aclosing(own.commands(me)) as commands:
            record, ack = await asyncio.wait_for(anext(commands), 10)
            assert isinstance(record.event, StopWork) and record.event.assignment_id == f"a-{me}"
            await ack()
        with pytest.raises(Exception):  # noqa: B017  (a permission violation: no answer, a time-out)
            async with contextlib.aclosing(own.commands(them)) as theirs:
                await asyncio.wait_for(anext(theirs), 3)
    async with raw_agent(enrolled) as (nc, errors):
        # its own consumer name with another worker's filter: the server refuses the mismatch
        config = {"name": f"agent-{me}", "durable_name": f"agent-{me}", "ack_policy": "explicit"}
        forged = {"stream_name": "COMMANDS", "config": {**config, "filter_subject": command_subject(them)}}
        reply = await nc.request(
            f"JS.KERNEL.API.CONSUMER.CREATE.COMMANDS.agent-{me}.{command_subject(me)}",
            json.dumps(forged).encode(),
            timeout=5,
        )
        assert "did not match filtered subject" in json.loads(reply.data)["error"]["description"]
        next_theirs = f"JS.KERNEL.API.CONSUMER.MSG.NEXT.COMMANDS.agent-{them}"
        await nc.publish(next_theirs, b'{"batch": 1}')
        await violation(errors, next_theirs)
        await nc.publish("_INBOX.x.y", b"")  # and it cannot reach the kernel's inboxes either
        await violation(errors, "_INBOX.x.y")
    remaining = await records(stack.log, "COMMANDS")
    assert [r.event.assignment_id for r in remaining] == [f"a-{them}"]  # theirs still queued


async def test_revoked_credentials_stop_working(stack: Stack) -> None:
    provider, key = await stack.provider()
    enrolled, state_dir = await stack.enroll("a1", provider, key)
    disconnected = asyncio.Event()

    async def on_disconnect() -> None:
        disconnected.set()

    creds = enrolled.nats
    nc = await nats.connect(
        creds.url,
        user=creds.user,
        password=creds.password,
        inbox_prefix=creds.inbox_prefix,
        disconnected_cb=on_disconnect,
        max_reconnect_attempts=2,
        reconnect_time_wait=0.2,
    )
    try:
        response = await stack.client.delete(
            f"/v1/providers/{provider}/agents/{enrolled.worker_id}",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code == 204, response.text
        await stack.synced()
        await asyncio.wait_for(disconnected.wait(), 10)  # the reload dropped the connection
    finally:
        await nc.close()
    with pytest.raises(LogUnavailable):
        await EventLog.connect(agent_settings(enrolled, state_dir, stack.log.settings))
    assert stack.server.agents_file is not None
    assert enrolled.nats.user not in stack.server.agents_file.read_text()


# -- a real agent process with enrolled credentials ------------------------------------------------


async def test_an_enrolled_agent_process_registers_and_runs_a_job(
    stack: Stack, enrolled_agents: Callable[..., AgentProcess]
) -> None:
    provider, key = await stack.provider()
    enrolled, state_dir = await stack.enroll("e2e", provider, key)
    assert load_enrollment(state_dir) == enrolled
    agent = enrolled_agents("e2e")
    assert await agent.worker_id() == enrolled.worker_id
    workers = await wait_records(stack.log, "WORKERS", lambda rs: of(rs, WorkerRegistered), "registered")
    [registered] = of(workers, WorkerRegistered)
    assert (registered.provider, registered.region) == (provider, "eu-north")  # as the token said
    async with coordinator(stack.log):
        await submit(stack.log, "enrolled", py('print(\'RESONTECH_PROGRESS {"step": 1, "loss": 0.5}\')'))
        jobs = await wait_records(stack.log, "JOBS", lambda rs: of(rs, JobCompleted), "job.completed")
    assert any(r.subject.endswith(".progress") for r in jobs)
    assert await stack.log.last_seq("HEARTBEATS", heartbeat_subject(enrolled.worker_id)) > 0
    assert await stack.log.last_seq("METERING") > 0
    agent.stop()
    # everything the agent did was within its permissions: the server logged no violation by it
    log_text = stack.server.log_file.read_text()
    assert not re.search(rf"user:{re.escape(enrolled.nats.user)}\".*Violation", log_text), log_text[-2000:]
