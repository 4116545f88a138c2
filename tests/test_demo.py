"""The README's first command works: the demo runs, recovers from its faults, loses nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_demo_recovers_from_a_killed_and_a_frozen_worker_and_loses_nothing():
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--jobs", "40"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert re.search(r"^lost:\s+0$", out, re.M)
    assert re.search(r"^jobs enqueued:\s+40$", out, re.M)
    assert "killed by SIGKILL" in out  # the kill -9
    assert re.search(r"silent for [\d.]+ s \(heartbeat timeout 3 s\)", out)  # the frozen one
    assert re.search(r"herder stopped \(exit 0\)", out)
    # Each exit is one event, logged once: the summary names each worker once.
    restarted = re.findall(r"^  slot \d+, pid (\d+): ", out, re.M)
    assert len(restarted) >= 2 and len(restarted) == len(set(restarted)), out
