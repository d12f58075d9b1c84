"""``resontech endpoints`` (:mod:`ops.cli.endpoints`): what it prints of an endpoint's traffic and line."""

from __future__ import annotations

from ops.cli.endpoints import traffic_text
from schemas.api.endpoints import Traffic


def test_the_cli_shows_the_line_beside_the_traffic_only_when_there_is_one() -> None:
    quiet = Traffic(requests=3, rps=0.05, p50_ms=4.0, p95_ms=5.0, p99_ms=6.0)
    assert traffic_text(quiet) == "3 req, 0.05 rps, 0.0% errors, p50/p95/p99 4.0/5.0/6.0 ms"
    busy = Traffic(requests=3, queue_depth=5, in_flight=8, wait_p50_ms=120.0, wait_p99_ms=900.4, rejected=2)
    assert traffic_text(busy).endswith("; 5 waiting, 8 in flight, wait p50/p99 120/900 ms, 2 refused (429)")
