"""``resontech watch JOB [--metric NAME]``: a job's events as lines, from its first (a late watcher
sees its whole history) until it ends, with the metric drawn as a sparkline (:mod:`ops.cli.sparkline`).

On a terminal the sparkline stays under the lines and is redrawn in place (ANSI: cursor up, erase
to the end of the screen); into a pipe or a file, where that would be noise, its lines are printed
after every :data:`PLAIN_EVERY` values and when the job ends. ``--json`` prints the feed's messages
as JSON lines, nothing else. A job that has already ended shows its whole curve, not its lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Generator
from contextlib import closing
from typing import TextIO

import msgspec

from gateway.client import Client
from ops.cli.session import client, job_ref
from ops.cli.sparkline import BLOCKS, Curve
from schemas.api.feed import FeedMessage, FeedTelemetry

ENDED = {"job.completed": "completed", "job.failed": "failed", "job.cancelled": "cancelled"}
WATCHED_FIELDS = (
    *("round", "epoch", "step", "loss", "slot", "worker_id", "reason", "object_key", "train_epoch"),
    *("server", "first_round", "rounds"),  # federated jobs: the FL server, each FL run
)
PLAIN_EVERY = 25
"""Values between two printings of the sparkline when the output is not a terminal."""
RENDER_ALWAYS = 2000
"""On a terminal, a curve of up to this many points is redrawn after every event that changes it."""
RENDER_SHARE = 0.1
"""A longer one is redrawn so that drawing takes at most this share of the time (a long history
replayed fast is drawn now and then, not after every event; the next event draws what is left)."""


def event_fields(message: FeedMessage) -> dict[str, object]:
    """The fields of a feed message's event (its stored event, as JSON)."""
    return message.event if isinstance(message.event, dict) else {}


def describe(message: FeedMessage) -> str:
    """One line for a feed event."""
    event = event_fields(message)
    stamp = (message.time or "")[11:19]
    if message.kind == "telemetry":
        gpus = msgspec.convert(event, FeedTelemetry).gpus
        utils = ", ".join(f"gpu{g.index} {g.util_pct or 0:.0f}%" for g in gpus) or "no GPU"
        return f"{stamp}  telemetry {message.worker}: {utils}"
    details = {k: v for k, v in event.items() if k in WATCHED_FIELDS and v not in (None, "")}
    metrics = event.get("metrics")
    if isinstance(metrics, dict):
        details.update(list(metrics.items())[:4])
    text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in details.items())
    return f"{stamp}  {message.kind.removeprefix('job.')}" + (f": {text}" if text else "")


def job_end(message: FeedMessage) -> str | None:
    """``completed``, ``failed`` or ``cancelled`` when the message ends its job, else ``None``."""
    ended = ENDED.get(message.kind)
    if ended == "failed" and event_fields(message).get("slot") is not None:
        return None  # one shard's failure: the kernel places it again, or fails the job
    return ended


class Plain:
    """Lines as they come; the sparkline now and then (:data:`PLAIN_EVERY`) and at the end."""

    def __init__(self, curve: Curve, out: TextIO) -> None:
        self.curve, self.out = curve, out
        self.ascii_only = not _encodes(out, BLOCKS)
        self.shown_at = 0

    def show(self, line: str) -> None:
        """Print ``line`` (the curve may have changed since the last one)."""
        print(line, file=self.out, flush=True)
        if self.curve.taken - self.shown_at >= PLAIN_EVERY:
            self._curve()

    def close(self) -> None:
        """The job ended (or the watcher stopped): its final curve, if it has one."""
        if self.curve.taken > self.shown_at:
            self._curve()

    def _curve(self) -> None:
        width = shutil.get_terminal_size().columns
        print("\n".join(self.curve.lines(width, ascii_only=self.ascii_only)), file=self.out, flush=True)
        self.shown_at = self.curve.taken


class Footer:
    """The sparkline under the lines of a terminal: before each new line it is erased, and drawn
    again after it (a long curve redrawn only so often: :data:`RENDER_ALWAYS`)."""

    def __init__(self, curve: Curve, out: TextIO) -> None:
        self.curve, self.out = curve, out
        self.ascii_only = not _encodes(out, BLOCKS)
        self.text: list[str] = []
        self.drawn = 0
        self.rendered = (-1, 0.0, 0.0)  # events taken, when, how long it took

    def show(self, line: str) -> None:
        """Print ``line`` above the sparkline, redrawn if the curve changed."""
        taken, at, cost = self.rendered
        due = self.curve.size() <= RENDER_ALWAYS or time.monotonic() - at >= cost / RENDER_SHARE
        if taken != self.curve.events and due:
            self._render()
        self._draw(line)

    def close(self) -> None:
        """Draw the final curve (or nothing, when there is no value to draw) and leave it."""
        self._render()
        if not self.curve.taken:
            self.text = []
        self._draw(None)

    def _render(self) -> None:
        start = time.monotonic()
        width = shutil.get_terminal_size().columns
        self.text = self.curve.lines(width, ascii_only=self.ascii_only)
        self.rendered = (self.curve.events, start, time.monotonic() - start)

    def _draw(self, line: str | None) -> None:
        erase = f"\x1b[{self.drawn}A\r\x1b[J" if self.drawn else ""
        above = "" if line is None else line + "\n"
        self.out.write(erase + above + "".join(f"{text}\n" for text in self.text))
        self.out.flush()
        self.drawn = len(self.text)


def _encodes(out: TextIO, text: str) -> bool:
    if not out.encoding:  # a text buffer (io.StringIO): any text
        return True
    try:
        text.encode(out.encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def on_terminal(out: TextIO) -> bool:
    """Whether ``out`` is a terminal that understands cursor movement."""
    return out.isatty() and os.environ.get("TERM") != "dumb"


def history(rt: Client, job_id: str, tenant: str | None) -> Generator[FeedMessage, None, None]:
    """The job's events from its first: stored, then live (the feed's own replay); closing it
    stops the feed's thread."""
    yield from rt.feed(job=job_id, tenant=tenant, after="jobs:0")


def follow_json(rt: Client, job_id: str, tenant: str | None) -> int:
    """``--json``: each feed message as a JSON line, until the job ends."""
    with closing(history(rt, job_id, tenant)) as messages:
        for message in messages:
            print(json.dumps(msgspec.to_builtins(message)), flush=True)
            ended = job_end(message)
            if ended is not None:
                return 0 if ended == "completed" else 1
    return 0


def follow(rt: Client, job_id: str, tenant: str | None, curve: Curve) -> int:
    """Each event as a line, the curve beside them, until the job ends (or Ctrl-C)."""
    view = Footer(curve, sys.stdout) if on_terminal(sys.stdout) else Plain(curve, sys.stdout)
    try:
        with closing(history(rt, job_id, tenant)) as messages:
            for message in messages:
                curve.take(message.kind, event_fields(message))
                ended = job_end(message)
                view.show(describe(message))
                if ended is not None:
                    view.show(f"job {job_id} {ended}")
                    return 0 if ended == "completed" else 1
        return 0
    finally:
        view.close()
        _say_absence(curve)


def replay(rt: Client, job_id: str, tenant: str | None, curve: Curve) -> None:
    """An ended job's curve, from its stored events up to its end."""
    with closing(history(rt, job_id, tenant)) as messages:
        for message in messages:
            curve.take(message.kind, event_fields(message))
            if job_end(message) is not None:
                break
    if curve.taken:
        width = shutil.get_terminal_size().columns
        ascii_only = not _encodes(sys.stdout, BLOCKS)
        print("\n".join(curve.lines(width, ascii_only=ascii_only)), flush=True)
    _say_absence(curve)


def _say_absence(curve: Curve) -> None:
    """Why no curve was drawn, unless the job reported nothing and no metric was asked for."""
    absence = curve.absence()
    if absence is not None and (curve.reported or curve.metric != "loss"):
        print(f"resontech watch: {absence}", file=sys.stderr, flush=True)


def cmd_watch(args: argparse.Namespace) -> int:
    """Live progress of one job until it ends (or Ctrl-C)."""
    job_id, tenant = job_ref(args.job)
    with client(args) as rt:
        job = rt.job(job_id, tenant=tenant)
        ended = job.state in ENDED.values()
        if args.json:
            return (0 if job.state == "completed" else 1) if ended else follow_json(rt, job_id, tenant)
        print(f"job {job.job_id} ({job.spec.name}): {job.state}", flush=True)
        curve = Curve(args.metric)
        if ended:
            replay(rt, job_id, tenant, curve)
            return 0 if job.state == "completed" else 1
        return follow(rt, job_id, tenant, curve)
