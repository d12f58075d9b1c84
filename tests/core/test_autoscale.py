"""Autoscaling decisions (:mod:`core.autoscale`), pure: the line and busy GPUs scale out, a starting replica
or the maximum hold it, a waiting line or busy GPUs block a scale-in, scale to zero and back."""

from __future__ import annotations

from core.autoscale import Load, decide
from schemas.endpoints import EndpointDeployed


def _bounds(**changes: object) -> EndpointDeployed:
    fields: dict[str, object] = {"name": "e", "model": "m", "max_replicas": 4, "target_rps_per_replica": 10.0}
    return EndpointDeployed(**{**fields, "max_concurrency": 2, **changes})  # type: ignore[arg-type]


def test_a_waiting_line_scales_out_even_under_the_rps_target() -> None:
    out = decide(_bounds(), desired=1, rps=0.5, idle_s=0.0, load=Load(queued=3.0, in_flight=2, ready=1))
    assert out is not None and out.replicas == 3  # ceil(3 waiting / 2 per replica) more
    assert out.inputs["queue_depth"] == 3.0 and out.inputs["in_flight"] == 2.0 and out.inputs["rps"] == 0.5
    assert "wait in line" in out.reason
    assert decide(_bounds(), 1, 0.5, 0.0, Load(queued=40.0, ready=1)).replicas == 4  # type: ignore[union-attr]


def test_no_queue_scale_out_while_a_replica_starts_or_at_the_maximum() -> None:
    assert decide(_bounds(), 2, 0.5, 0.0, Load(queued=5.0, ready=1)) is None  # the one asked for starts
    assert decide(_bounds(max_replicas=2), 2, 0.5, 0.0, Load(queued=5.0, ready=2)) is None
    assert decide(_bounds(), 1, 0.5, 0.0, Load(queued=0.4, ready=1)) is None  # a blip, not a line


def test_a_waiting_line_or_busy_gpus_block_a_scale_in() -> None:
    assert decide(_bounds(), 3, 1.0, 0.0, Load(ready=3)).replicas == 1  # type: ignore[union-attr]
    assert decide(_bounds(), 3, 1.0, 0.0, Load(queued=0.5, ready=3)) is None
    assert decide(_bounds(), 3, 1.0, 0.0, Load(ready=3, gpu_util_pct=70.0)) is None


def test_busy_gpus_add_one_replica_and_their_utilisation_is_recorded() -> None:
    # while every replica holds a request the gateway sent it (tests/e2e/trust/test_numbers.py: without)
    out = decide(_bounds(), 2, 1.0, 0.0, Load(ready=2, in_flight=2, gpu_util_pct=95.0))
    assert out is not None and out.replicas == 3 and out.inputs["gpu_util_pct"] == 95.0
    assert "gpu_util_pct" not in decide(_bounds(), 3, 1.0, 0.0, Load(ready=3)).inputs  # type: ignore[union-attr]


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
