"""Reading a pod's log a tail at a time (:mod:`ops.dispatcher.logs`): new lines only, a partial last line,
kubelet timestamps."""

from __future__ import annotations

from ops.dispatcher.logs import split_lines, text_of, unread


def test_new_lines_are_those_after_the_last_ones_read() -> None:
    assert unread([], ["a", "b"]) == ["a", "b"]
    assert unread(["a", "b"], ["a", "b", "c"]) == ["c"]
    assert unread(["a", "b"], ["b", "c", "d"]) == ["c", "d"]  # the tail starts inside what was read
    assert unread(["x", "y"], ["c", "d"]) == ["c", "d"]  # more than a tail was written between reads
    assert unread(["a", "b"], ["a", "b"]) == []
    # The longest run read last wins over a shorter, later repeat of its last line.
    assert unread(["s", "b", "c"], ["s", "b", "c", "d", "c"]) == ["d", "c"]


def test_a_partial_last_line_waits_unless_the_pod_ended() -> None:
    assert split_lines("a\nb\npart", final=False) == ["a", "b"]
    assert split_lines("a\nb\npart", final=True) == ["a", "b", "part"]
    assert split_lines("a\r\n", final=False) == ["a"]


def test_kubelet_timestamps_are_taken_off_and_only_they() -> None:
    line = '2026-11-24T10:00:00.123456789Z RESONTECH_PROGRESS {"step": 1}'
    assert text_of(line) == 'RESONTECH_PROGRESS {"step": 1}'
    assert text_of("2026 was a year") == "2026 was a year"
