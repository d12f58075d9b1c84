"""``resontech watch`` against a real served gateway: a job's progress appended to the log while the
CLI follows it; the sparkline of its loss grows under the lines, redrawn in place on a terminal (the
CLI under a pseudo-terminal) and printed now and then into a pipe; ``--json`` stays plain; an ended
job shows its whole curve, and a metric it never reported is named, not a traceback."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from core.log import EventLog
from core.streams import job_subject
from ops.cli.sparkline import BLOCKS, spark
from ops.cli.watch import PLAIN_EVERY
from schemas.jobs import JobCompleted, JobProgress
from tests.support import REPO
from tests.support.gateway import GatewayServer

SPARK = re.compile(f"loss ([{BLOCKS}]+)  ")
ERASE = "\x1b[1A\r\x1b[J"  # the footer's one line: up, to the start, erase to the end of the screen


def drawn(line: str) -> str:
    """The sparkline of a ``loss`` line."""
    match = SPARK.match(line)
    assert match is not None, line
    return match[1]


def cli_env(server: GatewayServer, key: str, home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RESONTECH_") and k not in ("COLUMNS", "LINES")
    }
    env.update(XDG_CONFIG_HOME=str(home), RESONTECH_DATA_DIR=str(home / "no-stack"))
    env.update(RESONTECH_GATEWAY_URL=server.url, RESONTECH_API_KEY=key, PYTHONIOENCODING="utf-8", **extra)
    return env


async def new_job(server: GatewayServer, key: str) -> str:
    response = await server.request(
        "POST", "/v1/jobs", key, json={"name": "spark", "kind": "process", "shards": 2, "command": ["true"]}
    )
    assert response.status_code == 201, response.text
    return str(response.json()["job_id"])


async def steps(log: EventLog, tenant: str, job_id: str, first: int, count: int) -> None:
    """Both shards' progress at steps ``first`` .. ``first + count - 1`` (shard 1: shard 0's loss + 0.5)."""
    for step in range(first, first + count):
        for slot in (0, 1):
            loss = 1.0 / (step + 1) + slot * 0.5
            event = JobProgress(epoch=1, slot=slot, step=step, loss=loss, metrics={"accuracy": step / 100})
            await log.append(job_subject(tenant, job_id, event), event)


def means(count: int) -> list[float]:
    """The mean over the two shards of the loss of :func:`steps` at its first ``count`` steps."""
    return [1.0 / (step + 1) + 0.25 for step in range(count)]


async def complete(log: EventLog, tenant: str, job_id: str) -> None:
    done = JobCompleted(outputs=[])
    await log.append(job_subject(tenant, job_id, done), done)


async def read_until(stream: asyncio.StreamReader, wanted: str, lines: list[str]) -> str:
    """Lines of ``stream`` into ``lines`` until one starts with ``wanted``; that line."""
    while True:
        line = (await asyncio.wait_for(stream.readline(), 30)).decode()
        assert line, f"the output ended before {wanted!r}: {lines}"
        lines.append(line.rstrip("\n"))
        if line.startswith(wanted):
            return lines[-1]


async def test_into_a_pipe_the_curve_comes_every_few_values_and_at_the_end_and_json_stays_plain(
    gateway_server: GatewayServer, log: EventLog, tmp_path: Path
) -> None:
    tenant, key = await gateway_server.tenant()
    job_id = await new_job(gateway_server, key)
    await steps(log, tenant, job_id, 0, 15)  # 30 values before anyone watches
    env = cli_env(gateway_server, key, tmp_path, COLUMNS="160")
    watch = [sys.executable, "-m", "ops.cli", "watch", job_id]
    plain = await asyncio.create_subprocess_exec(*watch, cwd=REPO, env=env, stdout=subprocess.PIPE)
    as_json = await asyncio.create_subprocess_exec(
        *watch, "--json", cwd=REPO, env=env, stdout=subprocess.PIPE
    )
    assert plain.stdout is not None and as_json.stdout is not None
    lines: list[str] = []
    first = await read_until(plain.stdout, "loss ", lines)  # from the history: a late watcher sees it
    assert lines[0] == f"job {job_id} (spark): queued" and "submitted" in lines[1]
    assert len(lines) == 2 + PLAIN_EVERY + 1 and "slot 0, step 12, loss 0.07692" in lines[-2]
    assert drawn(first) == spark([*means(12), 1 / 13])  # at step 12, shard 0 alone so far
    assert first.endswith("0.07692  min 0.07692 max 1.25  (mean of 2 shards, 13 points)")

    json_lines: list[str] = []
    await read_until(as_json.stdout, '{"kind": "job.submitted"', json_lines)  # following, not ended yet
    await steps(log, tenant, job_id, 15, 20)
    await complete(log, tenant, job_id)
    out, _ = await asyncio.wait_for(plain.communicate(), 30)
    lines += out.decode().splitlines()
    assert plain.returncode == 0 and lines[-2] == f"job {job_id} completed"
    curves = [line for line in lines if line.startswith("loss ")]
    assert len(curves) == 3 and "\x1b" not in "".join(lines)  # after 25, 50 values and at the end
    assert [len(drawn(c)) for c in curves] == [13, 25, 35]  # it grows
    assert curves[-1] == lines[-1] and curves[-1].endswith(
        "0.2786  min 0.2786 max 1.25  (mean of 2 shards, 35 points)"
    )

    out, _ = await asyncio.wait_for(as_json.communicate(), 30)
    assert as_json.returncode == 0
    json_lines += out.decode().splitlines()
    messages = [json.loads(line) for line in json_lines]  # JSON lines and nothing else
    kinds = [m["kind"] for m in messages]
    assert kinds == ["job.submitted", *["job.progress"] * 70, "job.completed"]
    assert messages[1]["event"]["loss"] == 1.0 and not any(b in "".join(json_lines) for b in BLOCKS)

    await ended_job_shows_its_whole_curve(env, job_id)


async def ended_job_shows_its_whole_curve(env: dict[str, str], job_id: str) -> None:
    def watch(*flags: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "ops.cli", "watch", job_id, *flags]
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    late, accuracy, unknown, as_json = await asyncio.gather(
        *(
            asyncio.to_thread(watch, *flags)
            for flags in ((), ("--metric", "accuracy"), ("--metric", "acc"), ("--json",))
        )
    )
    assert late.returncode == 0 and late.stdout.splitlines() == [
        f"job {job_id} (spark): completed",
        f"loss {spark(means(35))}  0.2786  min 0.2786 max 1.25  (mean of 2 shards, 35 points)",
    ]
    accuracy_line = (
        f"accuracy {spark([s / 100 for s in range(35)])}  0.34  min 0 max 0.34  (mean of 2 shards, 35 points)"
    )
    assert accuracy.stdout.splitlines()[1:] == [accuracy_line]
    assert unknown.returncode == 0 and unknown.stdout.splitlines() == [f"job {job_id} (spark): completed"]
    assert unknown.stderr == "resontech watch: acc: not reported; this job reports accuracy, loss\n"
    assert as_json.returncode == 0 and as_json.stdout == ""  # as before: an ended job, nothing to follow


class Terminal:
    """The CLI on a pseudo-terminal of ``columns`` columns; everything it writes, read as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str], columns: int) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=subprocess.PIPE
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the other side is closed
                return
            if not chunk:
                return
            self.output += chunk

    def text(self) -> str:
        return bytes(self.output).decode(errors="replace")

    async def wait_for(self, wanted: str) -> None:
        deadline = time.monotonic() + 30
        while wanted not in self.text():
            assert self.proc.poll() is None, f"exited before {wanted!r}: {self.text()!r}"
            assert time.monotonic() < deadline, f"no {wanted!r} in {self.text()!r}"
            await asyncio.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.reader.join(10)
        os.close(self.master)


async def test_on_a_terminal_the_curve_stays_under_the_lines_and_grows_in_place(
    gateway_server: GatewayServer, log: EventLog, tmp_path: Path
) -> None:
    tenant, key = await gateway_server.tenant()
    job_id = await new_job(gateway_server, key)
    await steps(log, tenant, job_id, 0, 3)
    env = cli_env(gateway_server, key, tmp_path, TERM="xterm")
    terminal = Terminal([sys.executable, "-m", "ops.cli", "watch", job_id], env, columns=100)
    try:
        await terminal.wait_for("(mean of 2 shards, 3 points)")  # the history first
        await steps(log, tenant, job_id, 3, 3)
        await terminal.wait_for("(mean of 2 shards, 6 points)")
        await complete(log, tenant, job_id)
        assert await asyncio.to_thread(terminal.proc.wait, 30) == 0
        assert terminal.proc.stderr is not None and terminal.proc.stderr.read() == b""
    finally:
        terminal.close()
    screen = terminal.text()
    frames = screen.split(ERASE)  # each: the line printed above the footer, then the footer
    assert len(frames) == 1 + 1 + 12 + 1 + 1  # submitted, 12 progress, completed, and the last drawing
    assert frames[0].startswith(f"job {job_id} (spark): queued\r\n") and "  submitted" in frames[0]
    assert all("  progress: epoch 1, slot" in frame.split("\r\n")[0] for frame in frames[1:13])
    sparks = [m[1] for m in SPARK.finditer(screen)]
    assert [len(s) for s in sparks] == sorted(len(s) for s in sparks) and len(sparks[-1]) == 6  # it grows
    assert frames[-2].startswith(f"job {job_id} completed\r\n")
    assert (
        frames[-1] == f"loss {spark(means(6))}  0.4167  min 0.4167 max 1.25  (mean of 2 shards, 6 points)\r\n"
    )
    assert all(len(line) < 100 for line in screen.replace(ERASE, "\r\n").split("\r\n"))  # fits the width
