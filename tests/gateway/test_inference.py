"""The inference proxy's parts (:mod:`gateway.inference`), pure: round robin past ejected replicas,
percentiles, RPS and error rate over the window."""

from __future__ import annotations

import pytest

from gateway.inference import EJECT_S, EndpointTraffic, InferenceProxy
from gateway.queueing import percentile


def test_round_robin_skips_ejected_replicas() -> None:
    proxy = InferenceProxy.__new__(InferenceProxy)
    proxy.traffic, proxy.ejected, proxy._probes = {}, {}, {}
    addresses = ["a", "b", "c"]
    firsts = [proxy.replicas_in_turn("k", addresses)[0] for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    import time

    proxy.ejected["b"] = time.monotonic() + EJECT_S
    assert proxy.replicas_in_turn("k", addresses) == ["a", "c"]


def test_percentiles_rps_and_error_rate_over_the_window() -> None:
    assert percentile([], 0.5) == 0.0
    values = [i / 100 for i in range(1, 101)]
    assert percentile(values, 0.5) == 0.5 and percentile(values, 0.99) == 0.99
    traffic = EndpointTraffic()
    for i in range(10):
        traffic.record(100.0 + i, 0.01 * (i + 1), ok=i != 9)
    figures = traffic.figures(110.0)
    assert figures.requests == 10 and figures.error_rate == pytest.approx(0.1)
    assert figures.p50_ms == pytest.approx(50.0) and figures.rps == pytest.approx(1.0)
    assert traffic.figures(1000.0).requests == 0
