"""The lines of a pod's log the dispatcher has not read yet. Pure.

The dispatcher reads each running pod's log forward on every round: from the second of the last line
it read (``sinceTime``: :func:`resume_from`; the kubelet compares whole seconds), at most
:data:`~ops.dispatcher.cluster.LOG_TAIL_BYTES` a read, again until a read reaches the log's end. It
keeps the last lines it read (:data:`~ops.dispatcher.state.HISTORY_LINES`). What is new is what follows
the place where those lines end in what was just read: the longest run of them that matches, latest
first. So no line is skipped however fast a pod writes, and none is read twice.

Lines are read with the kubelet's timestamps (``timestamps=true``), which make two equal lines
different, and :func:`text_of` takes them off before a line is parsed or shown. A log whose lines carry
no timestamp (kmock's) is read from its start each time, and matched as it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MATCH_LINES = 16
"""At most this many of the lines read last are looked for in the new tail."""
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d) ")


def resume_from(known: Sequence[str]) -> str:
    """Where to read on from: the kubelet's timestamp of the last line read, to the second (RFC 3339,
    UTC), or empty (from the log's start) when there is none."""
    found = _STAMP.match(known[-1]) if known else None
    if found is None:
        return ""
    return known[-1][: len("2026-01-01T00:00:00")] + "Z" if found.group(2) == "Z" else ""


def text_of(line: str) -> str:
    """A log line without the kubelet's timestamp."""
    found = _STAMP.match(line)
    return line[found.end() :] if found else line


def split_lines(text: str, *, final: bool) -> list[str]:
    """The complete lines of ``text`` (a last line without its newline waits for the next read,
    unless the pod has ended: ``final``)."""
    lines = text.split("\n")
    last = lines.pop()
    if final and last:
        lines.append(last)
    return [line.rstrip("\r") for line in lines]


def unread(history: Sequence[str], tail: Sequence[str]) -> list[str]:
    """The lines of ``tail`` after the end of ``history`` (every line when none of it is found)."""
    for k in range(min(len(history), MATCH_LINES, len(tail)), 0, -1):
        known = list(history[-k:])
        for end in range(len(tail), k - 1, -1):
            if list(tail[end - k : end]) == known:
                return list(tail[end:])
    return list(tail)
