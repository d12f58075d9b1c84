"""Per-agent budgets at the intake: how many claims one agent may have judged a second.

Every claim costs the kernel something (a decode, a judgement, a durable append or a QUARANTINE
write); a verification answer costs a recomputation of the benchmark (~0.2 s of CPU). An agent is a
stranger, so it gets a budget, and one agent's flood is refused at the door, before any of that,
without slowing anyone else's claims. The rules:

* **Claims**: a token bucket per sender of :data:`CLAIMS` (rate and burst), taken by every claim.
* **Verification answers** also take a bucket of their own, :data:`VERIFICATIONS` (an honest agent
  answers one challenge every few minutes at most).
* **Time** is the claims' store time on INTAKE (the server's clock), not the intake's: a backlog
  judged at once after a restart is not a burst, and two intakes agree.
* **Refusal is cheap**: the first claim over budget in a :data:`WINDOW_S` window is quarantined with
  a reason that says so (and how many the previous window dropped); the rest of that window are
  dropped and counted, never written (a QUARANTINE write per refused claim would itself be the
  flood's cost).
* **Memory is bounded**: at most :data:`KEPT` senders are remembered (the oldest half forgotten:
  a forgotten sender starts again with a full bucket, which costs at most one burst).

Pure: the caller passes the time; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW_S = 10.0
"""How often an agent over its budget gets one claim quarantined with the reason (the rest dropped)."""
KEPT = 100_000
"""Most agents whose buckets are remembered."""


@dataclass(frozen=True, slots=True)
class Budget:
    """``per_s`` claims a second on average, up to ``burst`` at once."""

    per_s: float
    burst: float


CLAIMS = Budget(per_s=200.0, burst=1_000.0)
"""Every claim of one agent. An honest agent sends at most one progress report a second per
assignment, a usage tick per assignment every few seconds, and a few reports per assignment's
start and end: 200 a second covers a host with a hundred assignments."""
VERIFICATIONS = Budget(per_s=0.1, burst=3.0)
"""Verification answers of one agent (one challenge every few minutes at most, when honest)."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    window_at: float = float("-inf")
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class OverBudget:
    """A claim over its sender's budget: quarantine it with ``reason``, or (``reason`` ``None``)
    drop it, counted."""

    reason: str | None


class AgentBudgets:
    """The buckets of every agent (see the module docstring)."""

    def __init__(
        self, claims: Budget = CLAIMS, verifications: Budget = VERIFICATIONS, window_s: float = WINDOW_S
    ) -> None:
        self.claims = claims
        self.verifications = verifications
        self.window_s = window_s
        self.dropped = 0
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def take(self, sender: str, verification: bool, at_s: float) -> OverBudget | None:
        """Charge one claim of ``sender`` stored at ``at_s`` (seconds); ``None`` if within budget."""
        over = self._take(sender, "claims", self.claims, at_s)
        if over is None and verification:
            over = self._take(sender, "verifications", self.verifications, at_s)
        return over

    def _take(self, sender: str, kind: str, budget: Budget, at_s: float) -> OverBudget | None:
        key = (sender, kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= KEPT:
                for old in list(self._buckets)[: KEPT // 2]:  # the oldest half
                    del self._buckets[old]
            bucket = self._buckets[key] = _Bucket(budget.burst, at_s)
        # refill by store time; a claim stored earlier than the last one (two intakes) refills nothing
        bucket.tokens = min(budget.burst, bucket.tokens + max(0.0, at_s - bucket.at) * budget.per_s)
        bucket.at = max(bucket.at, at_s)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        if at_s - bucket.window_at < self.window_s:  # already told this window: drop, counted
            bucket.dropped += 1
            self.dropped += 1
            return OverBudget(None)
        before, bucket.window_at, bucket.dropped = bucket.dropped, at_s, 0
        what = "verification answers" if kind == "verifications" else "claims"
        reason = (
            f"worker {sender} is over its budget of {budget.per_s:g} {what} a second (burst "
            f"{budget.burst:g}): refused, and its further {what} for {self.window_s:g} s dropped uncopied"
        )
        if before:
            reason += f" ({before} dropped in its last window)"
        return OverBudget(reason)


class Rate:
    """One token bucket per key (an assignment's progress reports), by the time the caller passes;
    at most ``kept`` keys remembered (all forgotten past it: each then starts with a full bucket)."""

    def __init__(self, budget: Budget, kept: int = KEPT) -> None:
        self.budget = budget
        self.kept = kept
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at, s)

    def take(self, key: str, at_s: float) -> bool:
        """Charge one for ``key`` at ``at_s`` (seconds); ``False`` if its bucket is empty."""
        tokens, at = self._buckets.get(key, (self.budget.burst, at_s))
        tokens = min(self.budget.burst, tokens + max(0.0, at_s - at) * self.budget.per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, max(at, at_s))
            return False
        if len(self._buckets) > self.kept:
            self._buckets.clear()
        self._buckets[key] = (tokens - 1.0, max(at, at_s))
        return True


__all__ = ["CLAIMS", "VERIFICATIONS", "AgentBudgets", "Budget", "OverBudget", "Rate"]
