"""Two gateways on one log, and clients given both: the SDK and the CLI move on to the other gateway
when one is killed (before a call, or in the middle of a batch of submits), every submit they saw
succeed is stored exactly once, and the feed follows on the other gateway from its cursor. Also the
pure rules underneath: parsing the URL list, the rotation, the deadline, which failures a call may
be sent again after."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator
from pathlib import Path

import httpx

from agent.enroll import enroll_through, load_enrollment
from core.log import EventLog
from gateway import AsyncClient, Client
from gateway.client import ApiError
from ops.ports import free_port
from schemas.api.jobs import Job
from schemas.jobs import JobSubmitted
from tests.support import REPO
from tests.support.accounts import provider, token
from tests.support.feed import progress, submit
from tests.support.gateway import Api, GatewayServer, ServeGateway

# -- two gateways, served ---------------------------------------------------------------------------


async def start_gateway(serve_gateway: ServeGateway) -> GatewayServer:
    """A served gateway whose feed pings every 0.5 s (a paused one is noticed soon)."""
    return await serve_gateway(RESONTECH_GATEWAY_FEED_PING_S="0.5")


async def two_gateways(
    serve_gateway: ServeGateway, operator_key: str
) -> tuple[GatewayServer, GatewayServer, str, str]:
    """Two gateways, and a tenant (id, admin key) that both already know."""
    first, second = await asyncio.gather(start_gateway(serve_gateway), start_gateway(serve_gateway))
    async with AsyncClient(first.url, operator_key) as operator:
        created = await operator.create_tenant(f"twice-{os.urandom(3).hex()}", "Twice")
    tenant, key = created.tenant.tenant, created.admin_key.key
    async with AsyncClient(second.url, key) as rt:  # the second gateway follows the log: wait for it
        deadline = time.monotonic() + 30.0
        while True:
            try:
                await rt.me()
                break
            except ApiError as exc:
                if exc.status != 401 or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    return first, second, tenant, key


async def submissions(log: EventLog) -> list[tuple[str, str]]:
    """Every ``job.submitted`` in the JOBS stream: (job id, job name)."""
    replay = log.replay("JOBS", subjects="job.*.*.submitted")
    return [(r.token(2), r.event.name) async for r in replay if isinstance(r.event, JobSubmitted)]


SPEC = {"kind": "process", "command": ["true"]}


# -- the SDK fails over ------------------------------------------------------------------------------


async def test_a_submit_lands_on_the_second_gateway_when_the_first_is_killed(
    serve_gateway: ServeGateway, operator_key: str, log: EventLog
) -> None:
    first, second, _, key = await two_gateways(serve_gateway, operator_key)
    with Client(f"{first.url},{second.url}", key) as rt:
        assert rt.gateways.current == first.url and rt.config.retry_s == 30.0
        rt.me()
        first.kill()
        job = await asyncio.to_thread(rt.submit_job, {"name": "after-the-kill", **SPEC})
        assert isinstance(job, Job) and job.state == "queued"
        assert rt.gateways.current == second.url  # later calls go straight to the one that answers
        assert rt.job(job.job_id).job_id == job.job_id
    assert await submissions(log) == [(job.job_id, "after-the-kill")]


async def test_a_create_stored_by_a_gateway_that_died_is_not_made_again_by_the_other(
    serve_gateway: ServeGateway, operator_key: str, log: EventLog
) -> None:
    """The idempotency record is the log: gateway 1 stored the submit, then died (its answer lost);
    the same call, with the same key, on gateway 2 answers with the same job."""
    first, second, _, key = await two_gateways(serve_gateway, operator_key)
    with Client(first.url, key) as only_first:
        stored = only_first.submit_job({"name": "once", **SPEC}, idempotency_key="lost-answer-1")
    first.kill()
    with Client([first.url, second.url], key) as rt:
        again = await asyncio.to_thread(
            rt.submit_job, {"name": "once", **SPEC}, idempotency_key="lost-answer-1"
        )
    assert again.job_id == stored.job_id
    assert await submissions(log) == [(stored.job_id, "once")]


async def test_a_gateway_killed_in_the_middle_of_a_batch_of_submits_duplicates_nothing(
    serve_gateway: ServeGateway, operator_key: str, log: EventLog
) -> None:
    """50 submits from 5 threads through one client given both gateways; once 10 have been answered,
    gateway 1 is paused (requests sent to it hang, some stored and not answered), then killed -9.
    Every submit the client saw succeed is stored exactly once, and none twice."""
    first, second, _, key = await two_gateways(serve_gateway, operator_key)
    answered: dict[str, Job] = {}
    failed: dict[str, str] = {}
    lock = threading.Lock()
    ten_done = threading.Event()

    waited: list[float] = []

    def one(rt: Client, name: str) -> None:
        began = time.monotonic()
        try:
            job = rt.submit_job({"name": name, **SPEC}, idempotency_key=f"key-{name}")
            waited.append(time.monotonic() - began)
        except ApiError as exc:
            with lock:
                failed[name] = str(exc)
            return
        with lock:
            answered[name] = job
            if len(answered) >= 10:
                ten_done.set()

    with Client([first.url, second.url], key, retry_s=60.0) as rt:
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(one, rt, f"batch-{i:02d}") for i in range(50)]
            assert await asyncio.to_thread(ten_done.wait, 60.0), failed
            first.pause()
            await asyncio.sleep(1.5)  # the requests in flight to gateway 1 hang
            first.kill()
            await asyncio.to_thread(concurrent.futures.wait, futures, 120.0)
        assert rt.gateways.current == second.url
    assert failed == {}
    assert max(waited) >= 1.0  # some submits were held by the paused gateway, then sent to the other
    assert len(answered) == 50
    stored = await submissions(log)
    per_name = Counter(name for _, name in stored)
    assert [name for name, count in per_name.items() if count > 1] == []
    assert sorted(stored) == sorted((job.job_id, name) for name, job in answered.items())


async def test_the_feed_follows_on_the_other_gateway_from_its_cursor(
    serve_gateway: ServeGateway, operator_key: str, log: EventLog
) -> None:
    first, second, tenant, key = await two_gateways(serve_gateway, operator_key)
    appended = [await submit(log, tenant, "j1")]
    appended += [await progress(log, tenant, "j1", step) for step in range(5)]
    seen: list[int] = []
    async with AsyncClient([first.url, second.url], key) as rt:
        feed = rt.feed(job="j1", after="jobs:0")
        assert isinstance(feed, AsyncGenerator)  # follow_feed's: closed below
        async for message in feed:
            assert message.seq is not None
            seen.append(message.seq)
            if len(seen) == 3:
                first.kill()  # mid-history: the rest comes from gateway 2, after the cursor
                appended += [await progress(log, tenant, "j1", step) for step in range(5, 10)]
            if len(seen) == len(appended):
                break
        await feed.aclose()
    assert seen == appended  # each event once, in order, across the two gateways


# -- the CLI --------------------------------------------------------------------------------------


async def test_the_cli_with_two_urls_works_while_the_first_is_down(
    serve_gateway: ServeGateway, operator_key: str, tmp_path: Path
) -> None:
    first, second, tenant, key = await two_gateways(serve_gateway, operator_key)
    first.kill()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESONTECH_")}
    env.update(
        XDG_CONFIG_HOME=str(tmp_path / "home"),
        RESONTECH_DATA_DIR=str(tmp_path / "no-stack"),
        RESONTECH_GATEWAY_URL=f"{first.url},{second.url}",
        RESONTECH_API_KEY=key,
    )

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ops.cli", *argv],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"name": "from-the-cli", **SPEC}))
    submitted = await asyncio.to_thread(cli, "submit", str(spec), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    listed = await asyncio.to_thread(cli, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [j["job_id"] for j in json.loads(listed.stdout)] == [job_id]
    whoami = await asyncio.to_thread(cli, "whoami")
    assert whoami.returncode == 0 and whoami.stdout.strip().endswith(f"at {second.url}"), whoami
    assert tenant in whoami.stdout

    env["RESONTECH_GATEWAY_URL"] = f"{first.url},ftp://nowhere"
    bad = await asyncio.to_thread(cli, "jobs")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == "error: gateway URL 'ftp://nowhere' is not an http:// or https:// URL with a host\n"


async def test_an_agent_enrolls_through_the_second_gateway_when_the_first_is_down(
    serve_gateway: ServeGateway, operator_key: str, tmp_path: Path
) -> None:
    """``resontech agent --enroll-token ... --gateway A,B``: a gateway that accepts no connection
    never had the one-time token, so the next one is asked."""
    served = await start_gateway(serve_gateway)
    async with httpx.AsyncClient(base_url=served.url, timeout=10.0) as http:
        api = Api(http, None, operator_key)
        name, key = await provider(api)
        issued = await token(api, name, key)
    down = f"http://127.0.0.1:{free_port()}"
    enrolled = await enroll_through(f"{down},{served.url}", issued["token"], tmp_path / "agent")
    assert enrolled.provider == name
    assert load_enrollment(tmp_path / "agent") == enrolled


# -- pure rules: parsing, rotation, deadline, what may be sent again ---------------------------------
