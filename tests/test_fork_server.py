"""Warm workers: forked from the fork server (herder.worker.template), the master's own
children all the same; plain spawns when it cannot serve; --preload, and new code after a
rolling restart; the subreaper reaps what it inherits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness import SHORT_TIMEOUT_FLAGS, Herder, plain_spawns, wait_for

WORKER_NAME = "herder-worker"  # herder.worker.template's WORKER_NAME

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux only"),
]


def names(ws: list[psutil.Process]) -> list[str]:
    return sorted(w.name() for w in ws)


def forked_fleet(herder, n: int) -> tuple[Herder, list[psutil.Process], psutil.Process]:  # noqa: ANN001
    """herder with `n` workers from its fork server, up: (it, its workers, its master)."""
    if plain_spawns():
        pytest.skip("this run spawns workers plainly (HERDER_FORK_SERVER=false)")
    h = herder(workers=str(n))
    ws = h.wait_workers(n)
    master = h.master()
    assert master is not None
    return h, ws, master


def test_workers_are_forked_from_the_template_and_are_the_masters_children(herder, jobs, conn):
    h, ws, master = forked_fleet(herder, 3)
    assert names(ws) == [WORKER_NAME] * 3
    assert all(w.ppid() == master.pid for w in ws)  # handed to the master, the subreaper
    template = h.fork_server()
    assert template is not None and template.ppid() == master.pid
    job = jobs.enqueue("record", "f", 0)
    jobs.wait_finished(job.id, 10, what="a job on a forked worker")
    # A forked worker's crash is a crash like any: reaped by the master, replaced by a fork.
    victim = ws[0].pid
    os.kill(victim, signal.SIGKILL)
    again = h.wait_workers(3, without={victim})
    assert [(e["how"], e["why"]) for e in h.exits(victim)] == [("killed by SIGKILL", "unexpected")]
    assert names(again) == [WORKER_NAME] * 3
    h.stop_and_check()


def test_the_first_template_is_forked_from_the_master_and_each_process_names_itself(herder):
    """The master forks its first template from itself (it shares the master's rq and redis);
    a forked process would keep the master's command line, so each names itself: `pkill -f
    herder.supervisor` reaches the master alone, never a worker mid-job."""
    h, ws, master = forked_fleet(herder, 2)
    template = h.fork_server()
    assert template is not None
    h.wait_log(rf"fork server pid {template.pid}: starting \(forked from the master\)")
    title = f"[herder master {master.pid}]"

    def shown(p: psutil.Process) -> str:
        return " ".join(p.cmdline()).strip()

    assert shown(template) == f"herder-forksrv {title}"
    assert {shown(w) for w in ws} == {f"herder-worker {title}"}
    assert template.name() == "herder-forksrv" and names(ws) == [WORKER_NAME] * 2
    tree = [master, *master.children(recursive=True)]
    assert [p.pid for p in tree if "herder.supervisor" in shown(p)] == [master.pid]
    h.stop_and_check()


def test_a_replacement_is_the_templates_spare_and_a_dead_spare_costs_nothing(herder, conn):
    """The template keeps a worker forked ahead (herder-spare), already the master's child and
    connected: a dead worker's replacement is that spare, listed by RQ under its pid. A spare
    killed before it was needed is reaped, and the next replacement is forked on the spot."""
    from harness import is_spare

    h, ws, master = forked_fleet(herder, 2)

    def spare(other_than: int = 0) -> psutil.Process | None:
        return next((k for k in master.children() if is_spare(k) and k.pid != other_than), None)

    first = wait_for(spare, 10, what="the template's spare")
    assert first.ppid() == master.pid  # handed to the master already, like a worker
    victim = ws[0].pid
    os.kill(victim, signal.SIGKILL)
    again = h.wait_workers(2, without={victim})
    assert first.pid in {w.pid for w in again}, "the replacement was not the spare"
    listed = {int(n.rsplit(b".", 1)[1]) for n in conn.smembers("rq:workers")}
    assert first.pid in listed  # RQ lists the spare, become a worker, under its own pid
    second = wait_for(lambda: spare(other_than=first.pid), 10, what="the next spare")
    second.kill()  # a spare dies before it is asked for...
    wait_for(lambda: not psutil.pid_exists(second.pid), 10, what="the master to reap the dead spare")
    victim = again[0].pid
    os.kill(victim, signal.SIGKILL)
    third = h.wait_workers(2, without={victim})  # ... and the next replacement is forked instead
    assert names(third) == [WORKER_NAME] * 2
    h.stop_and_check()  # the spare too: no process of this herder is left


def test_a_dead_fork_server_is_restarted_and_workers_keep_starting_meanwhile(herder, jobs):
    if plain_spawns():
        pytest.skip("this run spawns workers plainly (HERDER_FORK_SERVER=false)")
    h = herder(workers="2")
    h.wait_workers(2)
    template = h.fork_server()
    assert template is not None
    template.kill()
    # Reaped (not a zombie any more): the master has seen its fork server die.
    wait_for(lambda: not psutil.pid_exists(template.pid), 10, what="the master to reap its fork server")
    # Until the new one is up (its first restart waits 0.5 s), a replacement is a new interpreter.
    victim = h.workers()[0].pid
    os.kill(victim, signal.SIGKILL)
    ws = h.wait_workers(2, without={victim})
    assert "python" in {w.name()[:6] for w in ws}, names(ws)
    renewed = wait_for(lambda: h.fork_server(), 10, what="a new fork server")
    assert renewed.pid != template.pid  # type: ignore[union-attr]
    # The master has threads by now: the new one is a new interpreter, not a fork of it.
    (started,) = h.wait_log(rf"fork server pid {renewed.pid}: starting.*")  # type: ignore[union-attr]
    assert "forked" not in started.group(0)
    plain = next(w.pid for w in ws if w.name() != WORKER_NAME)
    # Past --min-uptime, or its death would count as dying young and the slot would back off.
    min_uptime = float(SHORT_TIMEOUT_FLAGS["--min-uptime"])
    h.wait_status(
        lambda s: any(w["pid"] == plain and w["uptime"] > min_uptime for w in s["workers"]),
        10,
        what=f"the plain worker to be older than --min-uptime {min_uptime} s",
    )
    os.kill(plain, signal.SIGKILL)
    wait_for(
        lambda: names(h.wait_workers(2, without={plain})) == [WORKER_NAME] * 2,
        10,
        what="forked workers again",
    )
    jobs.enqueue("record", "d", 0)
    wait_for(lambda: jobs.finished("d"), 10, what="a job after the restart")
    h.stop_and_check()


def test_preloaded_job_code_is_new_after_a_rolling_restart(herder, jobs, conn, tmp_path: Path):
    jobdir = tmp_path / "jobs"
    jobdir.mkdir()
    module = jobdir / "preloaded_jobs.py"
    module.write_text("def version():\n    return 1\n")
    h = herder(workers="2", path=[str(jobdir)], preload="preloaded_jobs")
    h.wait_workers(2)
    first = jobs.queue.enqueue("preloaded_jobs.version")
    wait_for(lambda: first.get_status(refresh=True) == "finished", 10, what="the first job")
    assert first.return_value() == 1
    old = {p.pid for p in h.workers()}
    before = module.stat().st_mtime
    module.write_text("def version():\n    return 2\n")
    # The same size: a later mtime second, so the cached bytecode of version 1 is not taken for it.
    os.utime(module, (before + 2, before + 2))
    r = subprocess.run(
        [h.argv[0], "restart", "--state-dir", h.state_dir], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    h.wait_workers(2, without=old)  # both old workers gone, two new ones ready
    assert sorted(int(e["pid"]) for e in h.graceful_exits()) == sorted(old)  # stopped, not killed
    second = jobs.queue.enqueue("preloaded_jobs.version")
    wait_for(lambda: second.get_status(refresh=True) == "finished", 10, what="the second job")
    assert second.return_value() == 2
    h.stop_and_check()


def test_no_fork_server_spawns_every_worker_as_a_new_interpreter(herder, jobs):
    h = herder(workers="2", no_fork_server=True)
    ws = h.wait_workers(2)
    assert h.fork_server() is None
    assert all(w.cmdline()[-2:] == ["-m", "herder.worker"] for w in ws)
    assert "workers start as new interpreters: --no-fork-server" in h.log()
    jobs.enqueue("record", "p", 0)
    wait_for(lambda: jobs.finished("p"), 10, what="a job on a spawned worker")
    h.stop_and_check()


def test_the_master_reaps_what_a_job_orphans(herder, jobs):
    """A job's daemonised grandchild is handed to a subreaper and reaped: no zombie stays. With
    the fork server the master is the subreaper; with plain spawns, the watchdog."""
    h = herder(workers="1")
    h.wait_workers(1)
    jobs.enqueue("orphan_a_child", "o", 1.0)  # the orphan outlives the job by about a second
    wait_for(lambda: jobs.finished("o"), 10, what="the job that orphans a child")
    master = h.master()
    assert master is not None
    plain = plain_spawns()
    adopter = psutil.Process(h.pid) if plain else master  # `herder run`'s pid is the watchdog

    def orphans() -> list[psutil.Process]:
        found = []
        for c in adopter.children():
            try:
                if c.name() == "sleep":
                    found.append(c)
            except psutil.NoSuchProcess:
                pass
        return found

    (orphan,) = wait_for(orphans, 5, what="the orphan handed to its subreaper")  # type: ignore[misc]
    # Gone from the process table (not a zombie): it exited and its new parent reaped it.
    wait_for(lambda: not psutil.pid_exists(orphan.pid), 10, what="the orphan to exit and be reaped")
    assert not [c.pid for c in adopter.children() if c.status() == psutil.STATUS_ZOMBIE]
    h.stop_and_check()
