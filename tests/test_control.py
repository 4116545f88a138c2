"""The control socket and the operator CLI, through the real `herder` command."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import HERDER, ready_pids, wait_for

pytestmark = pytest.mark.slow


def cli(h, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HERDER, *args, "--state-dir", str(h.workdir / "state")],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def status_json(h) -> dict:
    r = cli(h, "status", "--json")
    assert r.returncode in (0, 3), r.stderr
    return json.loads(r.stdout)


def test_status_matches_the_real_process_tree(herder, jobs):
    h = herder(workers="3")
    h.wait_workers(3)
    job = jobs.enqueue("record", "s", 3)
    wait_for(lambda: jobs.started("s"), 10, what="a job to start")
    # The queue numbers come from the observer's once-a-second reading: wait for one, then
    # read it as an operator does, through the CLI.
    h.wait_status(
        lambda s: any(w["job"] for w in s["workers"]) and s["queues"][0]["running"] == 1,
        5,
        what="the running job in the workers and in the queue reading",
    )
    st = status_json(h)
    assert any(w["job"] for w in st["workers"]) and st["queues"][0]["running"] == 1
    master = h.master()
    assert st["master"]["pid"] == master.pid
    assert st["watchdog"]["pid"] == h.pid
    assert sorted(w["pid"] for w in st["workers"]) == sorted(p.pid for p in h.workers())
    assert st["desired"] == st["actual"] == 3 and st["running"] is True
    busy = [w for w in st["workers"] if w["state"] == "busy"]
    assert len(busy) == 1 and busy[0]["job"] == job.id and busy[0]["job_seconds"] >= 0
    assert all(w["rss"] > 10 * 2**20 for w in st["workers"])
    assert st["queues"] == [
        {
            "name": "default",
            "backlog": 0,
            "running": 1,
            "growth": st["queues"][0]["growth"],
            "oldest_age": 0.0,
        }
    ]
    text = cli(h, "status")
    assert text.returncode == 0
    assert f"master {master.pid}" in text.stdout and job.id in text.stdout
    h.stop_and_check()


def test_scale_up_and_down_without_interrupting_a_job(herder, jobs):
    h = herder(workers="2")
    h.wait_workers(2)
    assert cli(h, "scale", "4").returncode == 0
    h.wait_workers(4, timeout=10)
    job = jobs.enqueue("record", "d", 2)
    busy_pid = h.worker_for_job(jobs.conn, job.id)
    # The master must know the worker is busy before the scale-down, or it may pick it.
    h.wait_status(
        lambda s: any(w["job"] == job.id and w["state"] == "busy" for w in s["workers"]),
        5,
        what="the master to see the job running",
    )
    r = cli(h, "scale", "1")
    assert r.returncode == 0 and "desired 1" in r.stdout
    # The idle ones go first; the busy one finishes its job.
    wait_for(lambda: jobs.finished("d") == [job.id], 10, what="the running job to finish")
    assert jobs.started("d") == [job.id]
    st = h.wait_status(  # the job records its finish just before the worker reports it done
        lambda s: len(s["workers"]) == 1 and s["workers"][0]["job"] is None,
        10,
        what="1 worker, done with its job, in status",
    )
    assert st["desired"] == st["actual"] == 1
    # The survivor is the worker that was busy: it kept its job and finished it, nobody was killed.
    assert [(w["pid"], w["jobs_ok"]) for w in st["workers"]] == [(busy_pid, 1)]
    assert {p.pid for p in h.workers()} == {busy_pid}
    assert st["totals"]["spawned"] == 4 and st["totals"]["killed"] == 0
    assert cli(h, "scale", "0").returncode == 2  # a usage error, like --workers 0
    assert cli(h, "scale", "--min", "1").returncode == 1  # autoscaling is off: a clear error
    h.stop_and_check()


def test_herder_stop_drains_and_exits(herder, jobs):
    h = herder(workers="2")
    h.wait_workers(2)
    job = jobs.enqueue("record", "x", 2)
    wait_for(lambda: jobs.started("x"), 10, what="the job to start")
    master_pid = h.snapshot()["master"]["pid"]
    r = cli(h, "stop")
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == ["stopping 2 workers", "stopped"]
    assert jobs.finished("x") == [job.id]
    h.stop_and_check(None, timeout=10)  # the watchdog did not restart a master stopped on purpose
    # One master only, the one asked to stop: it drained both workers, killed none.
    (summary,) = h.master_summaries()
    assert summary["pid"] == master_pid
    assert (summary["spawned"], summary["exited"], summary["killed"], summary["jobs_ok"]) == (2, 2, 0, 1)


def test_status_without_a_herder_exits_4(tmp_path: Path):
    r = subprocess.run([HERDER, "status", "--state-dir", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 4
    assert "no herder answering" in r.stderr


def test_socket_is_private_and_refuses_another_uid(herder):
    # A state dir outside pytest's 0700 temp tree, so only herder's own modes guard it.
    outer = Path(tempfile.mkdtemp(prefix="herder-uid-test-"))
    os.chmod(outer, 0o755)
    state = outer / "state"
    h = herder(workers="1", state_dir=str(state))
    h.wait_workers(1)
    sock = state / "herder.sock"
    assert oct(sock.stat().st_mode & 0o777) == "0o600"
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    nobody = pwd.getpwnam("nobody")
    # Open the file permissions on purpose, so only herder's own peer check stands in the way.
    os.chmod(state, 0o755)
    os.chmod(sock, 0o666)
    probe = (  # import first: as nobody, root's Python installation may not be readable
        "import os, sys; from herder.supervisor.ctl import client; "
        f"os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid}); "
        "print(client.call(sys.argv[1], {'cmd': 'status'}))"
    )
    repo = str(Path(__file__).resolve().parent.parent)
    r = subprocess.run(
        [sys.executable, "-c", probe, str(state), repo], capture_output=True, text=True, timeout=20
    )
    assert "permission denied" in r.stdout, r.stdout + r.stderr
    assert "refused a client with uid" in h.log()
    os.chmod(state, 0o700)
    h.stop_and_check()
    shutil.rmtree(outer, ignore_errors=True)


def test_status_never_shows_the_redis_password(herder, tmp_path: Path):
    from harness import start_redis

    proc, port = start_redis(tmp_path, "--requirepass", "pa55-w0rd-xyz")
    try:
        h = herder(redis_url=f"redis://:pa55-w0rd-xyz@127.0.0.1:{port}/0", workers="1")
        h.wait_workers(1)
        for args in (("status",), ("status", "--json")):
            out = cli(h, *args)
            assert "pa55-w0rd-xyz" not in out.stdout + out.stderr
            assert ":***@127.0.0.1" in out.stdout
        h.stop_and_check()
    finally:
        proc.terminate()
        proc.wait(10)


def test_rolling_restart_under_load_keeps_capacity_and_interrupts_nothing(herder, jobs):
    import collections
    import threading

    h = herder(workers="4")
    old = {p.pid for p in h.wait_workers(4)}
    ids = [jobs.enqueue("record", "r", 0.05).id for _ in range(300)]
    wait_for(lambda: len(jobs.finished("r")) > 20, 10, what="work under way")
    capacity: list[int] = []
    done = threading.Event()

    def sample() -> None:  # over the control socket, as `herder status` asks: no CLI start-up each time
        while not done.is_set():
            capacity.append(h.snapshot()["actual"])
            time.sleep(0.05)  # a sampling interval, not a wait for a state

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = cli(h, "restart")
        assert r.returncode == 0 and "replacing 4 workers" in r.stdout
        h.wait_status(
            lambda s: len(s["workers"]) == len(ready := ready_pids(s)) == 4 and old.isdisjoint(ready),
            30,
            what="every worker replaced: 4 new ones ready, no old one left",
        )
        wait_for(lambda: len(jobs.finished("r")) == 300, 60, what="all jobs")
    finally:
        done.set()
        sampler.join()
    assert len(capacity) >= 10, "the capacity sampler did not run"
    assert min(capacity) >= 4, f"capacity dipped to {min(capacity)}"
    assert collections.Counter(jobs.started("r")) == collections.Counter(ids)  # each started once
    assert sorted(jobs.finished("r")) == sorted(ids)
    # Each of the 4 replaced once, by stop and not by kill.
    totals = h.totals()
    assert (totals["spawned"], totals["killed"]) == (8, 0)
    h.stop_and_check()


def test_reload_rereads_the_file_but_keeps_flags(herder, jobs, tmp_path):
    conf = tmp_path / "herder.toml"
    conf.write_text("[herder]\nworkers = 2\nqueues = ['default']\nstop_timeout = 15\n")
    h = herder(workers=None, config=str(conf), stop_timeout="7")
    first = {p.pid for p in h.wait_workers(2)}
    conf.write_text("[herder]\nworkers = 3\nqueues = ['default', 'extra']\nstop_timeout = 99\n")
    h.signal(signal.SIGHUP)  # to the watchdog, which forwards it
    # The new settings in force, and a fleet of 3 new workers: the rolling restart for the
    # new queues done, the old workers gone.
    st = h.wait_status(
        lambda s: (
            s["settings"]["queues"] == ["default", "extra"]
            and s["desired"] == 3
            and len(s["workers"]) == len(ready := ready_pids(s)) == 3
            and first.isdisjoint(ready)
        ),
        30,
        what="the new queues, 3 desired, 3 new ready workers and no old one left",
    )
    # stop_timeout came from a flag: the file's 99 must not override it.
    assert st["settings"]["stop_timeout"] == 7
    assert re.search(r"SIGHUP: config re-read from .*; changed: queues, workers\n", h.log())
    from rq import Queue

    job = Queue("extra", connection=jobs.conn).enqueue("herder_testjobs.record", "extra")
    wait_for(lambda: jobs.finished("extra") == [job.id], 15, what="a job on the new queue")
    st = h.snapshot()
    assert [q["name"] for q in st["queues"]] == ["default", "extra"]
    bad = cli(h, "reload")
    assert bad.returncode == 0
    conf.write_text("[herder]\nworkers = 'lots'\n")
    r = cli(h, "reload")
    assert r.returncode == 1 and "must be an integer" in r.stderr
    # A bad file changes nothing.
    st = h.snapshot()
    assert (st["desired"], st["settings"]["queues"], st["settings"]["stop_timeout"]) == (
        3,
        ["default", "extra"],
        7,
    )
    assert len(h.workers()) == 3
    h.stop_and_check()


def test_enqueue_parses_json_args_and_the_job_runs(herder, jobs):
    from rq.job import Job

    h = herder(workers="1")
    h.wait_workers(1)
    r = cli(h, "enqueue", "herder_testjobs.record", "enq", "0.1")
    assert r.returncode == 0, r.stderr
    job_id, _, queue = r.stdout.split()[:3]
    assert queue == "default"
    wait_for(lambda: jobs.finished("enq") == [job_id], 10, what="the enqueued job")
    assert list(Job.fetch(job_id, connection=jobs.conn).args) == ["enq", 0.1]  # "enq" a string, 0.1 a number
    bad = cli(h, "enqueue", "--queue", "other", "herder_testjobs.record", '{"not": "closed"', "[1, 2]")
    assert bad.returncode == 0
    other = Job.fetch(bad.stdout.split()[0], connection=jobs.conn)
    assert other.origin == "other" and list(other.args) == ['{"not": "closed"', [1, 2]]
    h.stop_and_check()


def test_status_watch_refreshes_until_interrupted(herder):
    h = herder(workers="1")
    h.wait_workers(1)
    proc = subprocess.Popen(
        [HERDER, "status", "--watch", "--state-dir", h.state_dir], stdout=subprocess.PIPE, text=True
    )
    time.sleep(2.6)
    proc.send_signal(2)
    out, _ = proc.communicate(timeout=10)
    assert out.count("workers: 1 of 1 desired") >= 2  # refreshed, not printed once
    h.stop_and_check()
