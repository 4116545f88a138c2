"""Started as root with --user, herder runs its master and workers as that user."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from harness import wait_for

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")]


@pytest.fixture(scope="module")
def world_readable_install():
    """herder installed from Debian's python3 into a directory `nobody` can read and run
    (the test venv's interpreter may live under /root, which nobody can traverse)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or subprocess.run([python, "-c", "import venv, ensurepip"]).returncode != 0:
        pytest.skip("no system python3 with venv to install herder for another user")
    root = Path(tempfile.mkdtemp(prefix="herder-user-"))
    os.chmod(root, 0o755)
    subprocess.run([python, "-m", "venv", str(root / "venv")], check=True)
    subprocess.run(
        [str(root / "venv/bin/pip"), "install", "-q", "--disable-pip-version-check", str(REPO)],
        check=True,
        timeout=300,
    )
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_master_and_workers_run_as_the_given_user(herder, jobs, world_readable_install: Path):
    state = world_readable_install / "state"
    # The checkout may sit in a directory only root can read (a mktemp -d clone, say):
    # give nobody its own copy of the job module.
    jobs_dir = world_readable_install / "jobs"
    jobs_dir.mkdir(exist_ok=True)
    shutil.copy(REPO / "tests" / "jobs" / "herder_testjobs.py", jobs_dir)
    h = herder(
        workers="2",
        user="nobody",
        state_dir=str(state),
        path=str(jobs_dir),
        executable=str(world_readable_install / "venv/bin/herder"),
    )
    master = wait_for(h.master, 15, what="a master")
    workers = h.wait_workers(2)
    nobody = 65534
    assert psutil.Process(h.pid).uids().effective == 0  # the watchdog keeps root, to restart the master
    assert master.uids().effective == nobody and master.gids().effective != 0
    assert all(w.uids().effective == nobody for w in workers)
    assert state.stat().st_uid == nobody and (state / "herder.sock").stat().st_uid == nobody
    job = jobs.enqueue("record", "u")
    wait_for(lambda: jobs.finished("u") == [job.id], 15, what="a job run as nobody")
    # root may still ask for the status of a herder run as another user
    r = subprocess.run(
        [str(world_readable_install / "venv/bin/herder"), "status", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode == 0, r.stderr
    h.stop_and_check()
