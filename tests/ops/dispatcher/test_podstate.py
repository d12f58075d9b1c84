"""A pod's JSON -> what the dispatcher reports (pure): phase, node, containers' states, and
tolerance of what a cluster that is not the kernel's may send."""

from __future__ import annotations

from ops.dispatcher.podstate import MAX_TEXT, ContainerState, pod_state


def test_a_failed_pod_reads_with_its_exit_code_reason_and_times() -> None:
    pod = {
        "metadata": {"namespace": "ns", "name": "shard-0", "labels": {"resontech.io/slot": "0"}},
        "spec": {"nodeName": "gpu-a"},
        "status": {
            "phase": "Failed",
            "startTime": "2026-01-01T00:00:00Z",
            "containerStatuses": [
                {
                    "name": "main",
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "t1"}},
                }
            ],
        },
    }
    state = pod_state(pod)
    assert (state.namespace, state.name, state.phase, state.node) == ("ns", "shard-0", "Failed", "gpu-a")
    assert state.labels == {"resontech.io/slot": "0"} and state.started_at == "2026-01-01T00:00:00Z"
    assert state.containers == (
        ContainerState(name="main", state="terminated", reason="OOMKilled", exit_code=137, finished_at="t1"),
    )


def test_a_new_pod_is_pending_with_no_containers_and_a_waiting_one_says_why() -> None:
    assert pod_state({"metadata": {"name": "p"}}).phase == "Pending"
    assert pod_state({"metadata": {"name": "p"}}).containers == ()
    waiting = {"name": "main", "state": {"waiting": {"reason": "ImagePullBackOff"}}, "restartCount": 3}
    [container] = pod_state({"status": {"containerStatuses": [waiting]}}).containers
    assert (container.state, container.reason, container.restarts) == ("waiting", "ImagePullBackOff", 3)


def test_garbage_reads_as_not_reported_and_long_texts_are_cut() -> None:
    garbage = {
        "metadata": "x",
        "spec": [1],
        "status": {
            "phase": 7,
            "containerStatuses": [
                None,
                {"name": "m", "restartCount": "lots", "state": {"terminated": {"exitCode": "137"}}},
                {"name": "n", "state": {"running": "yes"}},
            ],
        },
    }
    state = pod_state(garbage)
    assert (state.name, state.phase, state.node) == ("", "Pending", "")
    assert [(c.name, c.state, c.exit_code, c.restarts) for c in state.containers] == [
        ("", "unknown", None, 0),
        ("m", "terminated", None, 0),
        ("n", "unknown", None, 0),
    ]
    long = pod_state({"status": {"phase": "F" * 10_000}})
    assert len(long.phase) == MAX_TEXT
