"""scripts/test-rq-suite's plumbing: rq's own tests run against herder's worker, not RQ's. One rq
test that builds a worker runs through the script (this venv, this rq), and the run names the
class rq's tests import as Worker: the class `herder run` builds (herder.worker.factory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import rq

from herder.common.config import Config
from herder.worker.factory import worker_class

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


def test_a_run_of_one_rq_test_reports_herders_worker_and_rqs_summary_last() -> None:
    env = {**os.environ, "HERDER_VENV": sys.prefix, "PYTHON": sys.executable}
    env.pop("HERDER_RQ_SUITE_WORKER", None)
    run = subprocess.run(
        [REPO / "scripts" / "test-rq-suite", rq.__version__, "-q", "-p", "no:warnings",
         "tests/test_worker.py::TestWorker::test_work_and_quit"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    built = worker_class(Config())
    assert f"rq.Worker and rq.SimpleWorker are {built.__module__}.{built.__name__}" in run.stdout, run.stdout
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().splitlines()[-1].startswith("1 passed"), run.stdout  # pytest's line, last
