"""The gateway's autoscaler (:mod:`gateway.autoscaler`): GPU utilisation from the replicas' workers, and an
endpoint holding a request is never idle."""

from __future__ import annotations

from gateway.autoscaler import Autoscaler, gpu_util
from gateway.inference import InferenceProxy
from projections.liveness import LastBeat, LivenessState
from schemas.values import GpuTelemetry
from tests.support.projection_records import endpoint_record


def test_gpu_utilisation_is_the_mean_over_the_replicas_workers_reporting_it() -> None:
    beats = LivenessState(
        beats={
            "w1": LastBeat(
                seq=1,
                time_ns=0,
                interval_s=1.0,
                gpus=[GpuTelemetry(index=0, util_pct=80.0), GpuTelemetry(index=1, util_pct=100.0)],
            ),
            "w2": LastBeat(seq=2, time_ns=0, interval_s=1.0, gpus=[GpuTelemetry(index=0)]),
            "w3": LastBeat(seq=3, time_ns=0, interval_s=1.0, gpus=[GpuTelemetry(index=0, util_pct=0.0)]),
        }
    )
    assert gpu_util(beats, {"w1", "w2"}) == 90.0
    assert gpu_util(beats, {"w2"}) is None and gpu_util(beats, set()) is None
    hostile = LastBeat(
        seq=4,
        time_ns=0,
        interval_s=1.0,
        gpus=[GpuTelemetry(index=0, util_pct=1e9), GpuTelemetry(index=1, util_pct=float("nan"))],
    )
    beats.beats["w4"] = hostile  # not percentages: left out, not "busy" (an agent cannot force a scale-out)
    assert gpu_util(beats, {"w1", "w4"}) == 90.0 and gpu_util(beats, {"w4"}) is None


def test_an_endpoint_holding_a_request_is_never_idle() -> None:
    proxy = InferenceProxy()
    scaler = Autoscaler(None, proxy)  # type: ignore[arg-type]
    endpoint = endpoint_record(tenant="t", endpoint_id="e", name="e", model="m", state="serving")
    assert scaler.idle_s("t/e", endpoint, 100.0) == 0.0  # serving since now
    assert scaler.idle_s("t/e", endpoint, 130.0) == 30.0
    line = proxy.line_of("t/e", endpoint.spec)
    line.enter("k", None, 130.0, ["r"])
    assert scaler.idle_s("t/e", endpoint, 500.0) == 0.0
    line.release("r", 500.0)
    assert scaler.idle_s("t/e", endpoint, 510.0) == 10.0
