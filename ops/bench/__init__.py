"""Benchmarks: programs that print figures as ratios to a baseline measured in the same run.

Run one with ``python -m ops.bench.NAME [--quick]``; ``make bench`` runs them all. Each prints a
table and, as its last line, one JSON object with its figures (see BENCH.md in the shared docs).
"""
