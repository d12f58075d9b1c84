"""``resontech watch``'s sparkline, pure: downsampling, drawing, a job's metric collected from feed
events (the mean over shards, a federated round's aggregate, recoveries, NaN), lines that fit the
width; and the two ways it is shown (under the lines of a terminal, or now and then into a pipe)."""

from __future__ import annotations

import io
import math

import pytest

from ops.cli.sparkline import (
    ASCII_BLOCKS,
    BLOCKS,
    GAP,
    Curve,
    downsample,
    metric_value,
    point_of,
    reported_metrics,
    spark,
)
from ops.cli.watch import PLAIN_EVERY, RENDER_ALWAYS, Footer, Plain

NAN, INF = math.nan, math.inf


def shard_progress(curve: Curve, slot: int, step: int, loss: float, **extra: object) -> bool:
    return curve.take("job.progress", {"epoch": 1, "slot": slot, "step": step, "loss": loss, **extra})


def test_downsample_keeps_what_fits_and_else_draws_each_column_as_a_bucket_mean() -> None:
    assert downsample([3.0, 1.0, 2.0], 3) == [3.0, 1.0, 2.0]
    assert downsample([3.0, 1.0], 10) == [3.0, 1.0]
    assert downsample(list(map(float, range(10))), 5) == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert downsample(list(map(float, range(10))), 3) == [1.0, 4.0, 7.5]  # buckets of 3, 3, 4
    assert downsample([1.0, 2.0], 0) == []


def test_downsample_leaves_out_non_finite_values_and_marks_a_bucket_of_none() -> None:
    columns = downsample([1.0, NAN, INF, -INF, 5.0, 7.0], 3)
    assert columns[0] == 1.0 and math.isnan(columns[1]) and columns[2] == 6.0


def test_spark_spans_the_blocks_from_the_least_value_to_the_greatest() -> None:
    assert spark([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]) == BLOCKS
    assert spark([10.0, 0.0, 5.0]) == "█▁▅"
    assert spark([2.5, 2.5, 2.5]) == "▄▄▄"  # a flat line: the middle block
    assert spark([-1e308, 1e308]) == "▁█"  # a span beyond a float's range
    assert spark([]) == ""
    assert spark([0.0, 7.0], ASCII_BLOCKS, "?") == "_#"


def test_spark_draws_nan_and_infinities_as_gaps() -> None:
    assert spark([1.0, NAN, 3.0, INF, -INF, 2.0]) == f"▁{GAP}█{GAP}{GAP}▅"
    assert spark([NAN, INF]) == GAP * 2


def test_a_metric_is_a_field_of_progress_or_a_key_of_its_metrics() -> None:
    event = {"loss": 0.5, "gpu_util_pct": 90, "step": 3, "metrics": {"accuracy": 0.75, "note": "x"}}
    assert metric_value(event, "loss") == 0.5
    assert metric_value(event, "gpu_util_pct") == 90.0
    assert metric_value(event, "accuracy") == 0.75
    assert metric_value(event, "step") is None  # a position, not a metric
    assert metric_value(event, "note") is None and metric_value(event, "missing") is None
    assert metric_value({"metrics": {"loss": 0.25}}, "loss") == 0.25  # a round's aggregate
    assert metric_value({"loss": None, "metrics": {"ok": True}}, "loss") is None  # JSON's NaN is null
    assert metric_value({"metrics": {"ok": True}}, "ok") is None
    assert reported_metrics(event) == {"loss", "gpu_util_pct", "accuracy"}


def test_a_point_is_round_epoch_and_step() -> None:
    assert point_of({"round": 2, "train_epoch": 3}) == (2, 3, -1)
    assert point_of({"step": 7}) == (-1, -1, 7)
    assert point_of({"epoch": 1}) is None  # the placement epoch is not a position in training


def test_the_shards_line_is_the_mean_over_shards_at_each_point_in_point_order() -> None:
    curve = Curve()
    assert shard_progress(curve, 1, 2, 0.5)  # out of order: drawn by step, not by arrival
    assert shard_progress(curve, 0, 1, 1.0)
    assert shard_progress(curve, 1, 1, 3.0)
    assert shard_progress(curve, 0, 2, 0.25)
    assert curve.shards.values() == [2.0, 0.375]
    assert curve.taken == 4 and not curve.job.points


def test_a_recovered_shard_replaces_its_values_at_the_same_points() -> None:
    curve = Curve()
    for step, loss in ((1, 1.0), (2, 0.8), (3, 0.6)):
        shard_progress(curve, 0, step, loss)
    shard_progress(curve, 0, 3, 0.7)  # placed again, resumed after its checkpoint at step 2
    shard_progress(curve, 0, 4, 0.5)
    assert curve.shards.values() == [1.0, 0.8, 0.7, 0.5]


def test_federated_rounds_draw_their_aggregate_once_beside_the_shards() -> None:
    curve = Curve("accuracy")
    for rnd in (1, 2):
        for slot in (0, 1):
            for epoch in (1, 2):
                acc = 0.5 + rnd / 10 + epoch / 100 + slot / 1000
                curve.take(
                    "job.progress",
                    {"slot": slot, "round": rnd, "train_epoch": epoch, "metrics": {"accuracy": acc}},
                )
        aggregate = {"round": rnd, "metrics": {"loss": 1 / rnd, "accuracy": 0.6 + rnd / 10}}
        curve.take("job.round_completed", aggregate)
        curve.take("job.progress", {"epoch": 1, "loss": 1 / rnd, **aggregate})  # the kernel's copy
    assert curve.shards.values() == pytest.approx([0.6105, 0.6205, 0.7105, 0.7205])
    assert curve.job.values() == pytest.approx([0.7, 0.8])  # one point per round, not two
    shards, job = curve.lines(120)
    assert shards.startswith("accuracy ▁▂▇█  0.7205  min 0.6105 max 0.7205  (mean of 2 shards, 4 points)")
    assert job.startswith("accuracy ▁█  0.8  min 0.7 max 0.8  (aggregate per round, 2 points)")


def test_events_without_the_metric_add_nothing_and_the_absence_names_what_the_job_reports() -> None:
    curve = Curve("accuracy")
    assert curve.absence() == "accuracy: no progress reported so far"
    assert not curve.take("job.started", {"slot": 0, "worker_id": "w"})
    assert not shard_progress(curve, 0, 1, 0.5, metrics={"top5": 0.9})
    assert curve.taken == 0 and not curve.shards.points
    assert curve.absence() == "accuracy: not reported; this job reports loss, top5"
    assert curve.lines(80) == ["accuracy: not reported; this job reports loss, top5"]
    assert curve.lines(20) == ["accuracy: not repor"]


def test_progress_without_a_position_is_each_reporters_next_point() -> None:
    curve = Curve()
    for loss in (3.0, 2.0, 1.0):
        curve.take("job.progress", {"epoch": 1, "loss": loss})
    assert curve.job.values() == [3.0, 2.0, 1.0]
    assert curve.lines(80) == ["loss █▅▁  1  min 1 max 3  (job-wide, 3 points)"]


def test_nan_and_infinities_are_gaps_left_out_of_min_and_max() -> None:
    curve = Curve()
    for step, loss in enumerate((2.0, NAN, 1.0, INF, 0.5)):
        shard_progress(curve, 0, step, loss)
    assert curve.lines(100) == [f"loss █{GAP}▃{GAP}▁  0.5  min 0.5 max 2  (shard 0, 5 points)"]
    shard_progress(curve, 0, 5, NAN)
    assert curve.lines(100)[0].startswith(f"loss █{GAP}▃{GAP}▁{GAP}  nan  min 0.5 max 2")
    only_nan = Curve()
    shard_progress(only_nan, 0, 1, NAN)
    assert only_nan.lines(80) == [f"loss {GAP}  nan  (shard 0, 1 point)"]


@pytest.mark.parametrize("width", [8, 20, 40, 60, 80, 120, 200])
def test_a_line_fits_the_width_and_downsamples_a_long_curve(width: int) -> None:
    curve = Curve()
    for step in range(1000):
        for slot in (0, 1):
            shard_progress(curve, slot, step, 1.0 / (step + 1) + slot)
    (line,) = curve.lines(width)
    assert len(line) <= width - 1 and line.startswith("loss ")
    drawn = line.split(" ")[1]
    assert set(drawn) <= set(BLOCKS) and len(drawn) < 1000  # bucket means, one per column
    if width >= 80:
        assert len(drawn) >= (width - 1) // 3 and "min 0.501 max 1.5" in line


def test_the_details_go_before_the_sparkline_shrinks() -> None:
    curve = Curve()
    for step in range(60):
        shard_progress(curve, 0, step, float(step))
    assert curve.lines(200)[0].endswith("  59  min 0 max 59  (shard 0, 60 points)")
    assert curve.lines(65)[0].endswith("  59  min 0 max 59  (shard 0)")
    assert curve.lines(50)[0].endswith("  59  min 0 max 59")
    assert curve.lines(30)[0].endswith("█  59")
    assert curve.lines(100, ascii_only=True)[0].startswith("loss ____")


def test_a_pipe_gets_the_sparkline_every_few_values_and_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    curve, out = Curve(), io.StringIO()
    plain = Plain(curve, out)
    for step in range(PLAIN_EVERY + 3):
        shard_progress(curve, 0, step, 1.0 / (step + 1))
        plain.show(f"progress: step {step}")
    plain.close()
    lines = out.getvalue().splitlines()
    drawn = [line for line in lines if line.startswith("loss ")]
    assert lines.index(drawn[0]) == PLAIN_EVERY  # after the 25th value's line
    assert len(drawn) == 2 and drawn[1] == lines[-1] and "\x1b" not in out.getvalue()
    assert len(drawn[0].split()[1]) == PLAIN_EVERY and len(drawn[1].split()[1]) == PLAIN_EVERY + 3


def test_a_terminal_keeps_the_sparkline_under_the_lines_and_redraws_it_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    curve, out = Curve(), io.StringIO()
    footer = Footer(curve, out)
    footer.show("first")
    assert out.getvalue() == "first\nloss: no progress reported so far\n"
    shard_progress(curve, 0, 1, 2.0)
    footer.show("second")
    shard_progress(curve, 0, 2, 1.0)
    footer.show("third")
    footer.close()
    frames = out.getvalue().split("\x1b[1A\r\x1b[J")  # up one line, erase to the end of the screen
    assert frames[1:] == [
        "second\nloss ▄  2  min 2 max 2  (shard 0, 1 point)\n",
        "third\nloss █▁  1  min 1 max 2  (shard 0, 2 points)\n",
        "loss █▁  1  min 1 max 2  (shard 0, 2 points)\n",
    ]


def test_a_terminal_says_why_nothing_is_drawn_and_is_left_without_a_sparkline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    curve, out = Curve("acc"), io.StringIO()
    footer = Footer(curve, out)
    footer.show("submitted")
    shard_progress(curve, 0, 1, 0.5)
    footer.show("progress")
    footer.close()
    assert out.getvalue() == (
        "submitted\nacc: no progress reported so far\n"
        "\x1b[1A\r\x1b[Jprogress\nacc: not reported; this job reports loss\n"
        "\x1b[1A\r\x1b[J"
    )


def test_a_terminal_redraws_a_long_curve_now_and_then_and_always_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    curve, out = Curve(), io.StringIO()
    for step in range(RENDER_ALWAYS + 1):
        shard_progress(curve, 0, step, float(step))
    footer = Footer(curve, out)
    footer.show("replayed")  # drawn: the first time
    drawn = footer.text
    shard_progress(curve, 0, RENDER_ALWAYS + 1, -1.0)
    footer.show("at once after")  # too soon after a drawing of so many points: the same text again
    assert footer.text == drawn and out.getvalue().count(drawn[0]) == 2
    footer.close()
    assert (
        footer.text != drawn
        and footer.text[0].startswith("loss ")
        and " -1  min -1 max 2000  (shard 0, 2002 points)" in footer.text[0]
    )
