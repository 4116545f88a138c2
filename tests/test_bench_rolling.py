"""The rolling restart scenario (scripts/bench/run rolling) at a tiny size: 4 workers, 20 ms
jobs. The report's figures are sane: the restart ended, the looks saw the whole fleet taking
jobs throughout (one replacement at a time, each before an old worker stops), jobs were done
before and during it, every job ran once and nothing was left running. docs/benchmarks.md
("Rolling restart") has the run at 256 workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "run"

pytestmark = pytest.mark.slow


def test_a_tiny_rolling_restart_reports_sane_figures(tmp_path: Path) -> None:
    out, md = tmp_path / "rolling.json", tmp_path / "rolling.md"
    argv = ["rolling", "--workers", "4", "--job-s", "0.02", "--steady-s", "1"]
    r = subprocess.run(
        [sys.executable, str(BENCH), *argv, "--json", str(out), "--markdown", str(md)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 2: the run itself could not be made
    [run] = json.loads(out.read_text())
    assert run["workers"] == 4
    assert 0 < run["duration"] < 30, run
    assert run["looks"] >= 3, run
    # Looks that see fewer than 3 of 4 taking jobs: a replacement's rule broken, or the looks
    # not seeing workers at all. Above 5 of 4: workers counted that are not there.
    assert 0.75 <= run["min_fraction"] <= run["p5_fraction"] <= 1.25, run
    assert run["held"] == (run["min_fraction"] >= 0.9)
    assert run["steady_rate"] > 0 and run["during_rate"] > 0, run
    assert run["per_second"] and all(x >= 0 for x in run["per_second"]), run
    assert run["log_min_ready"] is not None and run["log_min_ready"] >= 3, run
    assert run["enqueued"] > 0 and run["done"] == run["enqueued"] == run["runs"], run
    assert run["failed"] == 0 and run["left_running"] == [] and run["rq_left"] == 0, run
    assert run["exit_code"] == 0 and run["clean"], run
    assert "| 4 | 1 |" in md.read_text()
