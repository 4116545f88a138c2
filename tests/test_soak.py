"""A shorter long run (scripts/bench/run soak): 50,000 no-op jobs on 8 workers, and 10,000 on
threaded ones, recycling off. From the checkpoint (a tenth of the jobs) to the end, the master's
and each worker's RSS stay within the full run's bounds scaled to the run (never under the
allocator's 2 MiB of play), descriptors and threads do not grow, and Redis holds no herder key
more (docs/benchmarks.md, "The long run", has the full run's curves)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "run"

# `long`: .ci/run gives the long run a step of its own, alone on the machine (its memory bounds
# are a worker's own, not a neighbour test's), outside the main suite's parallel run.
pytestmark = [pytest.mark.slow, pytest.mark.long]


# The threaded run's checkpoint comes later: its master's memory settles over the first few
# thousand jobs (docs/benchmarks.md, "The long run"), a tenth of a short run is still inside that.
@pytest.mark.parametrize(
    ("jobs", "threads", "checkpoint"),
    [(50_000, 1, 0.1), (10_000, 4, 0.3)],
    ids=["one-job workers", "threaded"],
)
def test_a_long_run_leaks_nothing(tmp_path: Path, jobs: int, threads: int, checkpoint: float) -> None:
    out = tmp_path / "soak.json"
    argv = ["soak", "--jobs", str(jobs), "--threads", str(threads), "--checkpoint", str(checkpoint)]
    r = subprocess.run(
        [sys.executable, str(BENCH), *argv, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 2: the run itself could not be made
    report = json.loads(out.read_text())
    assert report["samples"][-1]["done"] == jobs
    assert report["held"], "\n".join(report["verdict"]) + "\n" + r.stdout
