"""The README's first command works: the demo runs, recovers from its faults, loses nothing, and
its dashboard marks the kill and the freeze with their causes while it runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from harness import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_demo_recovers_from_a_killed_and_a_frozen_worker_and_loses_nothing():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--jobs", "40", "--http", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    events: dict[int, dict] = {}
    try:
        while proc.poll() is None:  # what a person with the page open sees, as it happens
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/history", timeout=2) as answer:
                    events.update({e["id"]: e for e in json.load(answer)["events"]})
            except OSError:
                pass  # not up yet, or already stopped
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:
                pass
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"http://127.0.0.1:{port}/" in r.stdout
    said = [(e["kind"], e["text"]) for e in events.values()]
    assert any(kind == "died" and "SIGKILL" in text for kind, text in said), said  # the kill -9
    assert any(kind == "killed" and "heartbeat" in text for kind, text in said), said  # the frozen one
    out = r.stdout
    assert re.search(r"^lost:\s+0$", out, re.M)
    assert re.search(r"^jobs enqueued:\s+40$", out, re.M)
    assert "killed by SIGKILL" in out  # the kill -9
    assert re.search(r"silent for [\d.]+ s \(heartbeat timeout 3 s\)", out)  # the frozen one
    assert re.search(r"herder stopped \(exit 0\)", out)
    # Each exit is one event, logged once: the summary names each worker once.
    restarted = re.findall(r"^  slot \d+, pid (\d+): ", out, re.M)
    assert len(restarted) >= 2 and len(restarted) == len(set(restarted)), out
