"""A hostile workload: what a tenant's code would try on a provider's host, as a script.

The sandbox tests run it through every runtime (as a process, as torchrun's training script, inside
NVFlare's client and server, beside an inference engine). It looks for what it must never find and
tries what it must never manage, and prints one line ``PROBE_FINDINGS <json list>``: empty when the
sandbox held. Its targets come as a JSON object (its first argument, or ``PROBE_TARGETS`` pasted in
front when it is embedded in another script):

* ``absent``: host paths that must not exist in its view (the agent's state dir and files, other
  assignments, the kernel's data directory);
* ``secrets``: SHA-256 digests (hex) of values that must not be any other process's environment
  value or argument (digests: its own arguments, and so the sandbox's command line, hold them);
* ``pids``: host processes it must not be able to signal (the agent, other workloads);
* ``unwritable``: directories it must not be able to create a file in;
* ``replicas``: inference replicas it must not be able to call without their key;
* ``allowed``: where files may be (the read-only system and Python paths, its own directory); any
  other file it can see anywhere is a finding.

Standard library only: it runs with any interpreter.
"""

import hashlib
import json
import os
import sys
import urllib.error
import urllib.request

SKIP = ("/proc", "/sys", "/dev", "/usr", "/tmp")


def probe(targets):
    findings = []
    for path in targets.get("absent", []):
        if os.path.lexists(path):
            findings.append(f"sees {path}")
    allowed = (*targets.get("allowed", []), os.getcwd(), *SKIP)
    for top, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(allowed)]
        for name in files:
            path = os.path.join(top, name)
            if not path.startswith(allowed):
                findings.append(f"sees file {path}")
    secrets = set(targets.get("secrets", []))
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    items = f.read().split(b"\0")
            except OSError:
                continue
            values = [item.partition(b"=")[2] if part == "environ" else item for item in items]
            if any(hashlib.sha256(v).hexdigest() in secrets for v in values if v):
                findings.append(f"reads a secret in /proc/{pid}/{part}")
    for pid in targets.get("pids", []):
        try:
            os.kill(pid, 0)  # a probe for the right to signal it: no signal is delivered
            findings.append(f"may signal host pid {pid}")
        except ProcessLookupError:
            pass
        except PermissionError:
            findings.append(f"sees host pid {pid} (not allowed to signal it)")
    for directory in targets.get("unwritable", []):
        path = os.path.join(directory, f".probe-{me}")
        try:
            with open(path, "w") as f:
                f.write("x")
            findings.append(f"writes in {directory}")
            os.unlink(path)
        except OSError:
            pass
    for replica in targets.get("replicas", []):
        request = urllib.request.Request(
            f"{replica}/v1/embeddings",
            data=json.dumps({"model": "any", "input": "hello"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                findings.append(f"{replica} answered {answer.status} without its key")
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                findings.append(f"{replica} answered {exc.code} without its key, not 401")
        except OSError as exc:
            findings.append(f"cannot reach {replica} at all ({exc}): the test proves nothing")
    if os.getuid() == 0 or os.geteuid() == 0:
        findings.append("runs as root in its namespace")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    if status.get("NoNewPrivs", "").strip() != "1":
        findings.append("may gain privileges (no_new_privs is off)")
    if status.get("CapEff", "").strip() not in ("0000000000000000", ""):
        findings.append(f"holds capabilities {status['CapEff'].strip()}")
    # Its own host file: the test checks the host's /tmp never got it (/tmp is private).
    if targets.get("host_tmp_marker"):
        with open(targets["host_tmp_marker"], "w") as f:
            f.write("written from the sandbox")
    return findings


def report(targets):
    findings = probe(targets)
    # One write of the whole line: two ranks share one stdout, and an unbuffered print writes the text
    # and its newline apart, so their lines could interleave.
    sys.stdout.flush()
    os.write(1, ("PROBE_FINDINGS " + json.dumps(findings) + "\n").encode())
    return findings


if __name__ == "__main__":
    sys.exit(3 if report(json.loads(sys.argv[1])) else 0)
