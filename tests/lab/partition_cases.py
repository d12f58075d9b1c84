"""The partition cases of the network lab (:mod:`tests.lab.netlab`): write continuously, cut one node
off, heal it, and check what every node stored.

Each case:

1. picks its victim: the node that leads JOBS (``leader``, ``isolate``) or one that follows it
   (``follower``);
2. starts a writer given every node's URL and connected to one of the majority, a minority
   client given the victim's URL only, and a roaming client given every URL and connected to the
   victim (:mod:`tests.lab.partition_clients`); one append of the minority client is acknowledged
   before the cut, to show that it works;
3. cuts the victim off (``routes``: its route link down, its clients still reach it; ``all``: both
   links down) for at least ``min_partition_s`` and until the writer has had 100 acknowledgements
   since the cut and the roaming client one (it has to notice that its server answers nothing and
   move), while the minority client keeps appending (each append waits up to 2 s);
4. heals, lets the writer have 100 more acknowledgements, stops it, and waits until every replica
   is current and every node's own store (``/jsz``) ends at the same sequence;
5. reads the whole stream from each node's own store (a *sealed* read: the node's routes are cut
   for the time of the read, so that no other replica can answer; a leader hands over first) and
   checks that every event acknowledged so far, in this case and the ones before, is there exactly
   once, at the sequence its acknowledgement gave.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.lab.jsview import ViewError, all_current, local_state, pinned, read_ids, step_down, stream_info
from tests.lab.partition_clients import WRITER_ACK_TIMEOUT_S, MinorityClient, Writer

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from tests.lab.netlab import LabCluster, LabNode

STREAM = "JOBS"
CASES = {"leader": ("leader", "routes"), "follower": ("follower", "routes"), "isolate": ("leader", "all")}
"""case -> (the victim's role, what is cut)."""
WARM_UP_ACKS = 100
ACKS_TO_END_PARTITION = 100
ACKS_AFTER_HEAL = 100
PARTITION_DEADLINE_S = 120.0
SETTLE_DEADLINE_S = 180.0
SEALED_READ_DEADLINE_S = 60.0
STABLE_S = 3.0
STEP_DOWN_ATTEMPTS = 5
SEALED_FANOUT = 12
"""Identical requests per direct-get batch in a sealed read: each reaches the node's own replica
with a chance of 1 in 3 (the others are lost in the cut routes), so 12 all fail 1 time in 130."""


async def play_case(
    cluster: LabCluster, case: str, acked: dict[str, int], min_partition_s: float
) -> dict[str, Any]:
    """Play one case; ``acked`` (event id -> sequence) gains the events acknowledged in it.

    Returns:
        The case's findings, which ``tests/lab/test_partition.py`` holds to the issue.
    """
    role, cut = CASES[case]
    began = time.monotonic()
    # Stable: a node whose routes were just restored (the last sealed read) may still unseat the
    # leader with the higher term it campaigned for while cut off.
    info = await settled_info(cluster, stable_s=STABLE_S)
    victim = cluster.node(_pick_victim(info, role))
    result: dict[str, Any] = {"case": case, "victim": victim.name, "victim_role": role, "cut": cut}
    result["leader_before"] = info["cluster"]["leader"]
    prefix = f"{len(acked)}-{case}"  # unique across the cases of one run, even a case played twice
    writer = await Writer.connect(cluster.url, f"{prefix}-w", victim.host)
    roamer = await Writer.connect(cluster.url, f"{prefix}-r", victim.host, on_it=True)
    try:
        minority = await MinorityClient.connect(victim.url, f"{prefix}-m")
        try:
            healed_at, during = await _partition(
                cluster, victim, cut, (writer, roamer), minority, min_partition_s, result
            )
        finally:
            await minority.log.close()
    finally:
        await writer.log.close()
        await roamer.log.close()
    acked.update({event_id: seq for _, event_id, seq in [*writer.acks, *roamer.acks]})
    acked.update(dict(minority.acked))  # the control append, and any the minority should not have had
    info = await settled_info(cluster)
    result["settled_after_heal_s"] = round(time.monotonic() - healed_at, 2)
    result["leader_after"] = info["cluster"]["leader"]
    result["nodes"] = await audit_nodes(cluster, acked, during)
    result["case_s"] = round(time.monotonic() - began, 2)
    return result


async def _partition(
    cluster: LabCluster,
    victim: LabNode,
    cut: str,
    writers: tuple[Writer, Writer],
    minority: MinorityClient,
    min_partition_s: float,
    result: dict[str, Any],
) -> tuple[float, set[str]]:
    """Write, cut, heal; ``result`` gains what the clients saw. Returns when it healed (monotonic)
    and the event ids the minority client tried during the partition. ``writers``: the majority's
    writer and the roaming client (on the victim at the cut)."""
    net = cluster.net
    down, up = (net.cut_routes, net.restore_routes) if cut == "routes" else (net.cut_all, net.restore_all)
    writer, roamer = writers
    stop_writer, stop_minority = asyncio.Event(), asyncio.Event()
    writing = asyncio.gather(writer.run(stop_writer), roamer.run(stop_writer))
    probing: asyncio.Task[None] | None = None
    roamed_to = ""
    try:
        await minority.control()
        tried, acked, outcomes = len(minority.attempted), len(minority.acked), Counter(minority.outcomes)
        await _until(lambda: len(writer.acks) >= WARM_UP_ACKS, "the writer's first acknowledgements")
        await _until(
            lambda: roamer.connected_to == f"{victim.host}:{victim.port}", "the roamer on the victim"
        )
        leader = (await _info_via(cluster.nodes))["cluster"]["leader"]
        if (leader == victim.name) != (result["victim_role"] == "leader"):
            raise RuntimeError(f"the leader moved to {leader} before the cut of {victim.name}")
        result["leader_at_cut"] = leader
        result["cut_at"] = _wall_clock()
        cut_at = time.monotonic()
        moved_by = cut_at + WRITER_ACK_TIMEOUT_S  # a later acknowledgement is of an append sent after the cut
        down(victim.node)
        try:
            probing = asyncio.create_task(minority.run(stop_minority))
            await asyncio.sleep(min_partition_s)
            await _until(
                lambda: writer.acked_between(cut_at) >= ACKS_TO_END_PARTITION,
                "the majority's acknowledgements during the partition",
            )
            await _until(lambda: roamer.acked_between(moved_by) > 0, "the roamer's first acknowledgement")
            roamed_to = roamer.connected_to  # where it is while the cut holds: after the heal it may go back
            result["leader_during"] = (await _info_via(cluster.nodes, avoid=victim))["cluster"]["leader"]
            stop_minority.set()
            await probing
        finally:
            healed_at = time.monotonic()
            up(victim.node)
        result["partition_s"] = round(healed_at - cut_at, 2)
        result["minority"] = {
            "connected_to": minority.connected_to,
            "victim_address": f"{victim.host}:{victim.port}",
            "acked_before_cut": acked,
            "attempts": len(minority.attempted) - tried,
            "acked": len(minority.acked) - acked,
            "outcomes": dict(minority.outcomes - outcomes),
        }
        await _until(
            lambda: writer.acked_between(healed_at) >= ACKS_AFTER_HEAL, "acknowledgements after healing"
        )
    finally:
        stop_writer.set()
        stop_minority.set()
        await writing
        if probing is not None:
            await probing
    first_ack = min((t for t, _, _ in roamer.acks if t >= moved_by), default=None)
    result["roamer"] = {
        "connected_during_partition": roamed_to,
        "connected_to": roamer.connected_to,
        "acked_during_partition": roamer.acked_between(moved_by, healed_at),
        "first_ack_after_cut_s": None if first_ack is None else round(first_ack - cut_at, 2),
        "failures": dict(roamer.failures),
        "failure_messages": roamer.failure_messages,
    }
    result["writer"] = {
        "acked": len(writer.acks),
        "acked_during_partition": writer.acked_between(cut_at, healed_at),
        "acked_after_heal": writer.acked_between(healed_at),
        "longest_stall_s": round(writer.longest_gap(cut_at, healed_at), 2),
        "failures": dict(writer.failures),
        "failure_messages": writer.failure_messages,
    }
    return healed_at, set(minority.attempted[tried:])


def _pick_victim(info: dict[str, Any], role: str) -> str:
    leader: str = info["cluster"]["leader"]
    if role == "leader":
        return leader
    return min(str(replica["name"]) for replica in info["cluster"]["replicas"])


async def settled_info(cluster: LabCluster, stable_s: float = 0.0) -> dict[str, Any]:
    """The stream's info once it has a leader, every replica is current and every node's own copy
    ends at the same sequence, all of it under the same leader for ``stable_s`` seconds.

    Raises:
        RuntimeError: not settled within 180 s.
    """
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    since: tuple[float, str] | None = None  # since when it has been settled, and under which leader
    seen: object = "nothing"
    while True:
        try:
            info = await _info_via(cluster.nodes)
            states = [
                await asyncio.to_thread(local_state, node.monitor_url, STREAM) for node in cluster.nodes
            ]
            seen = (info.get("cluster"), [s and s["last_seq"] for s in states])
            last, leader = info["state"]["last_seq"], info["cluster"]["leader"]
            settled = all_current(info) and all(s is not None and s["last_seq"] == last for s in states)
            if not settled:
                since = None
            elif since is None or since[1] != leader:
                since = (time.monotonic(), leader)
            if since is not None and time.monotonic() - since[0] >= stable_s:
                return info
        except Exception as exc:  # a node answering nothing for a moment: ask again
            seen = exc
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the replicas of {STREAM} did not settle within {SETTLE_DEADLINE_S:g}s; last seen: {seen}"
            )
        await asyncio.sleep(0.25)


async def _info_via(nodes: list[LabNode], avoid: LabNode | None = None) -> dict[str, Any]:
    """Stream info asked through the first node (not ``avoid``) that answers."""
    error: Exception = ViewError("no node to ask")
    for node in nodes:
        if node is avoid:
            continue
        try:
            nc = await pinned(node.url, "lab-info")
        except Exception as exc:
            error = exc
            continue
        try:
            return await stream_info(nc, STREAM)
        except Exception as exc:
            error = exc
        finally:
            await nc.close()
    raise error


async def audit_nodes(cluster: LabCluster, acked: dict[str, int], minority: set[str]) -> dict[str, Any]:
    """Read every node's own copy of the stream (one after the other) and check it against
    ``acked``; ``minority`` are the event ids the minority client tried during the partition."""
    audits = {}
    for node in cluster.nodes:
        info = await settled_info(cluster)
        for _ in range(STEP_DOWN_ATTEMPTS):  # a leader hands over first: cutting it costs an election
            if info["cluster"]["leader"] != node.name:
                break
            await _step_down(node)
            info = await settled_info(cluster)  # the same node may win the election that follows
        if info["cluster"]["leader"] == node.name:
            raise RuntimeError(
                f"{node.name} stayed the leader of {STREAM} through {STEP_DOWN_ATTEMPTS} step-downs"
            )
        audits[node.name] = await _audit_node(cluster, node, info["state"]["last_seq"], acked, minority)
    await settled_info(cluster)
    return audits


async def _step_down(node: LabNode) -> None:
    """Ask the leader to hand over; refused now and then (10008, JetStream busy): the caller asks again."""
    nc = await pinned(node.url, "lab-stepdown")
    try:
        await step_down(nc, STREAM)
    except (ViewError, TimeoutError):
        pass
    finally:
        await nc.close()
    await asyncio.sleep(1.0)  # the info would still name the old leader for a moment


async def _audit_node(
    cluster: LabCluster, node: LabNode, last_seq: int, acked: dict[str, int], minority: set[str]
) -> dict[str, Any]:
    """A sealed read of ``node``'s copy: its routes cut, read through a connection to it alone."""
    state = await asyncio.to_thread(local_state, node.monitor_url, STREAM) or {}
    nc = await pinned(node.url, f"lab-read-{node.name}")
    cluster.net.cut_routes(node.node)
    try:
        stored = await _read_retrying(nc, last_seq)
    finally:
        cluster.net.restore_routes(node.node)
        await nc.close()
    seq_of = {msg_id: seq for seq, msg_id in stored}
    counts = Counter(msg_id for _, msg_id in stored)
    return {
        "last_seq": state.get("last_seq"),
        "messages": state.get("messages"),
        "read": len(stored),
        "duplicates": sorted(msg_id for msg_id, n in counts.items() if n > 1)[:20],
        "missing_acked": sorted(set(acked) - set(seq_of))[:20],
        "seq_mismatches": sorted(i for i, seq in acked.items() if i in seq_of and seq_of[i] != seq)[:20],
        "minority_stored": len(minority & set(seq_of)),
    }


async def _read_retrying(nc: NATS, last_seq: int) -> list[tuple[int, str]]:
    deadline = time.monotonic() + SEALED_READ_DEADLINE_S
    while True:
        try:
            return await read_ids(nc, STREAM, last_seq, fanout=SEALED_FANOUT)
        except (ViewError, TimeoutError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


def _wall_clock() -> str:
    """Local time with milliseconds, as nats-server's log lines have it (to find the cut in them)."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PARTITION_DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {PARTITION_DEADLINE_S:g}s waiting for {what}")
        await asyncio.sleep(0.05)
