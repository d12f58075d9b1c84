"""The supervisor of a shard pod (:mod:`ops.dispatcher.supervise`), run as the pod runs it: a real
process with the workload as its child, uploading to a real S3-compatible server through presigned PUT
URLs. The workload is hostile in the tests that say so: it plants links, hard links and FIFOs, swaps its
checkpoint folder for a link, and names paths outside it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from core.objects import provision
from core.protocol import CHECKPOINT
from ops.devstack.objectstore import ObjectStoreServer
from ops.dispatcher import supervise
from tests.support import REPO

BUCKET = "rt-supervised"
SUPERVISOR = REPO / "ops" / "dispatcher" / "supervise.py"
KEYS = ["jobs/j1/checkpoints/j1/e1-a", "jobs/j1/checkpoints/j1/e1-b"]


@pytest.fixture
def s3(object_store: ObjectStoreServer) -> Any:
    client = object_store.client()
    provision(client, BUCKET)
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    return client


def urls_file(s3: Any, tmp_path: Path, keys: list[str] = KEYS) -> Path:
    """The Secret's file: presigned PUTs of ``keys``, in order."""
    urls = [[k, s3.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": k})] for k in keys]
    path = tmp_path / "urls.json"
    path.write_text(json.dumps(urls))
    return path


def supervised(tmp_path: Path, urls: Path, workload: str, **popen: Any) -> subprocess.Popen[bytes]:
    """The supervisor as the pod's first process, the workload a Python script in the working dir."""
    folder = tmp_path / "work" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(SUPERVISOR), str(urls), str(folder), "--", sys.executable, "-c", workload]
    env = {"PATH": os.environ["PATH"], "RESONTECH_CHECKPOINT_DIR": str(folder)}
    return subprocess.Popen(
        argv, cwd=tmp_path / "work", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen
    )


def finished(process: subprocess.Popen[bytes]) -> tuple[int, list[str], str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out.decode().splitlines(), err.decode()


def stored(s3: Any) -> dict[str, bytes]:
    items = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    return {i["Key"]: s3.get_object(Bucket=BUCKET, Key=i["Key"])["Body"].read() for i in items}


HONEST = """
import json, os
folder = os.environ["RESONTECH_CHECKPOINT_DIR"]
print("epoch 1 of 3", flush=True)
for step in (10, 20, 30):
    os.makedirs(os.path.join(folder, "run"), exist_ok=True)
    with open(os.path.join(folder, "run", f"step-{step}.pt"), "wb") as f:
        f.write(b"weights at %d" % step)
    print("RESONTECH_PROGRESS " + json.dumps({"step": step, "loss": 1.0 / step}), flush=True)
    print("RESONTECH_CHECKPOINT " + json.dumps({"path": f"run/step-{step}.pt", "step": step}), flush=True)
print("RESONTECH_CHECKPOINT " + json.dumps({"object_key": "jobs/j1/checkpoints/j1/e1-a", "step": 31}))
"""


def test_the_keyword_is_the_protocols() -> None:
    assert supervise.KEYWORD == CHECKPOINT


def test_each_reported_file_goes_to_the_next_url_and_is_reported_by_its_key(s3: Any, tmp_path: Path) -> None:
    code, out, err = finished(supervised(tmp_path, urls_file(s3, tmp_path), HONEST))
    assert code == 0, err
    assert out[0] == "epoch 1 of 3" and out[1].startswith("RESONTECH_PROGRESS ")  # as printed
    reports = [json.loads(line.split(" ", 1)[1]) for line in out if line.startswith(CHECKPOINT)]
    assert reports == [
        {"step": 10, "object_key": KEYS[0]},
        {"step": 20, "object_key": KEYS[1]},
        {"step": 30, "object_key": KEYS[0]},  # in turn: the upload in flight never overwrites the last
        {"object_key": KEYS[0], "step": 31},  # a key the workload wrote itself goes out as it is
    ]
    assert stored(s3) == {KEYS[0]: b"weights at 30", KEYS[1]: b"weights at 20"}
    assert list((tmp_path / "work" / "checkpoints" / "run").iterdir()) == []  # sent files are deleted


HOSTILE = """
import json, os
folder = os.environ["RESONTECH_CHECKPOINT_DIR"]
secret = os.path.join(os.path.dirname(os.path.dirname(folder)), "secret.txt")
def report(path):
    print("RESONTECH_CHECKPOINT " + json.dumps({"path": path}), flush=True)
os.symlink(secret, os.path.join(folder, "link.pt"))
report("link.pt")
os.link(secret, os.path.join(folder, "hard.pt"))
report("hard.pt")
os.mkfifo(os.path.join(folder, "fifo.pt"))
report("fifo.pt")
report("../../secret.txt")
report("/etc/passwd")
os.symlink(os.path.dirname(secret), os.path.join(folder, "up"))
report("up/secret.txt")
# the folder the supervisor holds is now checkpoints.old; a link in its place, to the secret's folder
os.rename(folder, folder + ".old")
os.symlink(os.path.dirname(secret), folder)
report("secret.txt")
"""


def test_a_workload_cannot_make_the_supervisor_send_a_file_outside_its_folder(
    s3: Any, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("the pod's service token")
    code, out, err = finished(supervised(tmp_path, urls_file(s3, tmp_path), HOSTILE))
    assert code == 0, err
    assert [line for line in out if line.startswith(CHECKPOINT)] == []  # no report of any of them
    assert stored(s3) == {}
    assert err.count("supervise: checkpoint refused") == 7, err
    assert "'link.pt'" in err and "'hard.pt' is not a regular file with one link" in err
    assert "'fifo.pt' is not a regular file with one link" in err
    assert "'../../secret.txt' is not a relative path" in err and "'/etc/passwd' is not a relative" in err
    assert "'secret.txt': No such file or directory" in err  # looked up in the folder it held
    assert (tmp_path / "secret.txt").read_text() == "the pod's service token"


def test_a_refused_upload_is_no_report_and_the_file_stays(s3: Any, tmp_path: Path) -> None:
    urls = urls_file(s3, tmp_path)
    forged = [[k, u.replace("Signature=", "Signature=0")] for k, u in json.loads(urls.read_text())]
    urls.write_text(json.dumps(forged))
    workload = HONEST.replace("for step in (10, 20, 30)", "for step in (10,)")
    code, out, err = finished(supervised(tmp_path, urls, workload))
    assert code == 0 and "upload failed: HTTPError: HTTP Error 403" in err, err
    assert [json.loads(line.split(" ", 1)[1]) for line in out if line.startswith(CHECKPOINT)] == [
        {"object_key": KEYS[0], "step": 31}
    ]
    assert stored(s3) == {} and (tmp_path / "work" / "checkpoints" / "run" / "step-10.pt").exists()


def test_the_workloads_status_is_the_supervisors_and_a_stop_reaches_the_workload(
    s3: Any, tmp_path: Path
) -> None:
    urls = urls_file(s3, tmp_path)
    assert finished(supervised(tmp_path, urls, "raise SystemExit(3)"))[0] == 3
    assert (
        finished(supervised(tmp_path, urls, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))[0]
        == 137
    )
    graceful = (
        "import signal, time\n"
        "stop = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
        "print('ready', flush=True)\n"
        "while not stop:\n"
        "    time.sleep(0.05)\n"
        "print('saving', flush=True)\n"
        "raise SystemExit(7)\n"
    )
    process = supervised(tmp_path, urls, graceful)
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)  # the kubelet stopping the pod
    code, out, err = finished(process)
    assert (code, out) == (7, ["saving"]) and time.monotonic() - started < 30, err


def test_bad_arguments_are_a_usage_line() -> None:
    ran = subprocess.run([sys.executable, str(SUPERVISOR), "urls.json"], capture_output=True, text=True)
    assert ran.returncode == 2 and ran.stderr.startswith("usage: supervise.py URLS_JSON FOLDER -- ARGV")
