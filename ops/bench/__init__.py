"""Benchmarks: programs that print figures as ratios to a baseline measured in the same run.

Run one with ``python -m ops.bench.NAME [--quick]``; ``make bench`` runs them all. Each prints a
table and, as its last line, one JSON object with its figures (see BENCH.md in the shared docs).

=============================  ==================================================================
module                         what it is
=============================  ==================================================================
``ops.bench.log``              program: appends and projection rebuilds against raw nats-py
``ops.bench.intake``           program (and part of ``log``): usage ticks through the intake
``ops.bench.schedule``         program: placement, heartbeat ingest, failure detection
``ops.bench.placement``        part of ``schedule``: a real coordinator places jobs on a simulated
                               fleet
``ops.bench.heartbeats``       part of ``schedule``: a simulated fleet beats at 1 Hz while a
                               registry follows live
``ops.bench.failover``         part of ``schedule``: SIGKILL a real agent, time loss and replacement
``ops.bench.raw_appends``      the ``schedule`` baselines: raw ``js.publish`` of the same appends
``ops.bench.gateway``          program: job submit latency and live-feed delivery, as served
``ops.bench.feed``             part of ``gateway``: WebSocket feed clients under a steady append rate
``ops.bench.servedstack``      nats-server, the object store and a served gateway (``gateway``,
                               ``inference``)
``ops.bench.inference``        program: proxy overhead, cold start, scale-out
``ops.bench.training``         program: federated rounds against the plain NVFlare simulator
``ops.bench.sandbox``          program: a workload's cost in the sandbox
``ops.bench.agents``           real agents and other child processes (``schedule``, ``training``)
``ops.bench.common``           what every benchmark shares: a private nats-server, peak RSS, the
                               table and the closing JSON line
``ops.bench.quantiles``        quantiles as the figures are quoted
=============================  ==================================================================
"""
