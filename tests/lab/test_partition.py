"""A network partition of a 3-node JetStream cluster, with real network namespaces (issue 16).

The lab (:mod:`tests.lab.netlab`) runs in namespaces of its own (``unshare -Urnm``: no privilege
needed where unprivileged user namespaces are allowed, as on the project's CI). It cuts off the
leader of JOBS, then a follower, then the leader again entirely, each for at least 8 s while a writer
appends, and reports what the clients saw and what each node stored. This test holds it to the
issue: the minority refuses writes, nothing acknowledged is lost or stored twice, the majority goes
on, and the healed node catches up; and a client given every URL that was on the node cut off moves
to the majority and is acknowledged there during the partition.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lab.netns import NetLabError, ensure_private_network

REPO = Path(__file__).resolve().parents[2]
LAB_TIMEOUT_S = 900
MAJORITY_ACKS = 100  # what the lab waits for during the partition, and after healing


def _require_namespaces() -> None:
    """Fail (never skip) where the lab cannot run: CI has user namespaces, and a skip would hide it."""
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            pytest.fail(f"the partition test needs `{tool}` (util-linux / iproute2) on PATH")
    probe = subprocess.run(
        [
            "unshare",
            "-Urnm",
            "--fork",
            "--kill-child",
            "--",
            "ip",
            "link",
            "add",
            "v0",
            "type",
            "veth",
            "peer",
            "name",
            "v1",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        reason = probe.stderr.decode(errors="replace").strip()
        pytest.fail(
            "the partition test needs unprivileged user and network namespaces (`unshare -Urnm`), "
            f"refused here: {reason} (allow them: sysctl kernel.unprivileged_userns_clone=1, "
            "user.max_user_namespaces > 0, or AppArmor's kernel.apparmor_restrict_unprivileged_userns=0)"
        )


def _run_lab(workdir: Path) -> dict[str, Any]:
    argv = ["unshare", "-Urnm", "--fork", "--kill-child", "--", sys.executable, "-m", "tests.lab.netlab"]
    # On a time-out subprocess.run SIGKILLs unshare, --kill-child SIGKILLs the lab, and every node
    # and namespace holder dies with the lab (PR_SET_PDEATHSIG, see tests/lab/netns.py).
    done = subprocess.run(
        [*argv, "--workdir", str(workdir)], cwd=REPO, capture_output=True, timeout=LAB_TIMEOUT_S, check=False
    )
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    stderr = done.stderr.decode(errors="replace")[-4000:]
    assert done.returncode == 0 and lines, f"the lab exited with {done.returncode}:\n{stderr}"
    report: dict[str, Any] = json.loads(lines[-1])
    assert report["ok"], f"the lab failed: {report['error']} (logs in {workdir})\n{stderr}\n{report}"
    return report


def _problems(case: dict[str, Any]) -> list[str]:
    """Everything in one case's findings that breaks the issue's promises."""
    name, victim, minority, writer = case["case"], case["victim"], case["minority"], case["writer"]
    problems = []
    if minority["acked_before_cut"] != 1:
        problems.append("the minority client's control append was not acknowledged before the cut")
    if minority["attempts"] == 0 or minority["acked"] != 0:
        problems.append(f"the minority acknowledged {minority['acked']} of {minority['attempts']} appends")
    if minority["connected_to"] != minority["victim_address"]:
        problems.append(f"the minority client moved to {minority['connected_to']}")
    if writer["acked_during_partition"] < MAJORITY_ACKS or writer["acked_after_heal"] < MAJORITY_ACKS:
        problems.append(f"the majority did not go on: {writer}")
    roamer = case["roamer"]
    stayed = roamer["connected_during_partition"] == minority["victim_address"]
    if roamer["acked_during_partition"] == 0 or stayed:
        problems.append(f"the roaming client did not move to the majority: {roamer}")
    if case["victim_role"] == "leader" and case["leader_during"] in (victim, None):
        problems.append(f"no new leader during the partition (leader: {case['leader_during']})")
    last_seqs = {node["last_seq"] for node in case["nodes"].values()}
    if len(last_seqs) != 1:
        problems.append(f"the nodes end at different sequences: {case['nodes']}")
    for node_name, node in case["nodes"].items():
        where = f"{node_name}{' (the healed node)' if node_name == victim else ''}"
        for key in ("missing_acked", "duplicates", "seq_mismatches"):
            if node[key]:
                problems.append(f"{where}: {key} {node[key]}")
        if not node["read"] == node["messages"] == node["last_seq"]:
            problems.append(
                f"{where}: read {node['read']} of {node['messages']} messages, last {node['last_seq']}"
            )
    return [f"{name}: {problem}" for problem in problems]


def test_the_lab_refuses_a_real_hosts_network() -> None:
    """Run as root without ``unshare``, the lab would add bridges to the host: it refuses."""
    with pytest.raises(NetLabError):
        ensure_private_network()


@pytest.mark.faults
def test_a_partitioned_node_refuses_writes_loses_nothing_and_catches_up(tmp_path: Path) -> None:
    _require_namespaces()
    report = _run_lab(tmp_path / "lab")
    assert [case["case"] for case in report["cases"]] == ["leader", "follower", "isolate"]
    problems = [problem for case in report["cases"] for problem in _problems(case)]
    assert not problems, "\n".join(problems) + f"\n(logs in {report['workdir']})"
