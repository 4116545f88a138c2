"""`herder run` starts its master's interpreter before it loads click (herder.common.config.prestart):
a refused configuration or a held state dir still exits with its code and leaves nothing
running, a valid one gets that very master, adopted by the watchdog, and the secrets kept out
of the watchdog's environment are kept out of that master's too.

A sitecustomize on PYTHONPATH makes the master visible and slow: it writes its pid to a file
and, asked to, sleeps as if its imports took seconds, so an exit that did not end it would find
it still alive."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from harness import run_herder, wait_for
from herder.common.config import SECRET_KEYS, env_of, prestart
from herder.common.exits import EX_CONFIG, EX_TEMPFAIL
from herder.supervisor.control.http_auth import ENV_TOKEN

SITECUSTOMIZE = """\
import os, sys, time
if sys.orig_argv[-2:] == ["-m", "herder.supervisor"] and os.environ.get("PRESTART_MARK"):
    with open(os.environ["PRESTART_MARK"], "a") as f:
        f.write(f"{os.getpid()} {' '.join(sorted(k for k in os.environ if k.startswith('HERDER_')))}\\n")
    with open(os.environ["PRESTART_MARK"]) as f:
        first = len(f.read().splitlines()) == 1
    if first and os.environ.get("PRESTART_DIE"):
        os._exit(3)  # the first master dies loading
    time.sleep(float(os.environ.get("PRESTART_SLEEP", "0")))
"""


@pytest.fixture
def marked(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose masters write their pid to the returned file as they start."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mark = tmp_path / "masters"
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "PRESTART_MARK": str(mark)}, mark


def started(mark: Path) -> dict[int, set[str]]:
    """Each master started: its pid, and the HERDER_* variables it started with."""
    lines = mark.read_text().splitlines() if mark.exists() else []
    return {int(pid): set(names) for pid, *names in (line.split() for line in lines)}


def pids(mark: Path) -> list[int]:
    return list(started(mark))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_prestarted_master_keeps_out_the_secrets_the_watchdog_is_kept_from() -> None:
    assert {env_of(k) for k in SECRET_KEYS} | {ENV_TOKEN} == prestart.SECRET_ENV


@pytest.mark.parametrize(
    ("argv", "env", "wanted"),
    [
        (["/venv/bin/herder", "run", "--redis-url", "redis://x/0"], {}, True),
        (["/venv/bin/herder", "run", "--redis-url=redis://x/0"], {}, True),
        (["/venv/bin/herder", "run", "--config", "/etc/herder.toml"], {}, True),
        (["/venv/bin/herder", "run"], {"HERDER_REDIS_URL": "redis://x/0"}, True),
        (["/venv/bin/herder", "run"], {}, False),  # an embedded Redis starts first
        (["/venv/bin/herder", "run", "--redis-url", "redis://x/0", "--help"], {}, False),
        (["/venv/bin/herder", "status", "--redis-url", "redis://x/0"], {}, False),
        (["/usr/bin/pytest", "run", "--redis-url", "redis://x/0"], {}, False),
        # root with a user to run as: the watchdog starts that master, as that user
        (["/venv/bin/herder", "run", "--redis-url", "redis://x/0", "--user", "rq"], {}, os.geteuid() != 0),
    ],
)
def test_only_herder_run_with_a_redis_url_prestarts(
    argv: list[str], env: dict[str, str], wanted: bool
) -> None:
    assert prestart.wanted(argv, env) is (wanted and os.uname().sysname == "Linux")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "posix_spawn") or os.uname().sysname != "Linux", reason="Linux only")
def test_a_refused_config_exits_78_naming_the_key_and_ends_the_prestarted_master(
    tmp_path: Path, marked: tuple[dict[str, str], Path]
) -> None:
    env, mark = marked
    env["PRESTART_SLEEP"] = "30"  # its imports, were they that slow, would outlive `herder run`
    started = time.monotonic()
    r = run_herder(
        "--redis-url", "redis://127.0.0.1:1/0", "--state-dir", str(tmp_path / "s"), "--stop-timeout", "-3",
        env=env,
    )  # fmt: skip
    assert r.returncode == EX_CONFIG, r.stderr
    assert "stop_timeout" in r.stderr and "command line" in r.stderr
    assert time.monotonic() - started < 15, "herder run waited for the master instead of ending it"
    wait_for(lambda: pids(mark), 5, what="the prestarted master's pid")  # it was started
    [pid] = pids(mark)
    assert gone(pid), "the prestarted master outlived the refused configuration"


@pytest.mark.slow
@pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux only")
def test_a_held_state_dir_exits_75_and_ends_the_prestarted_master(
    tmp_path: Path, marked: tuple[dict[str, str], Path]
) -> None:
    from herder.common import statelock

    env, mark = marked
    env["PRESTART_SLEEP"] = "30"
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    fd = statelock.acquire(str(state))  # this test's pid holds it: a live herder, to herder run
    try:
        r = run_herder("--redis-url", "redis://127.0.0.1:1/0", "--state-dir", str(state), env=env)
    finally:
        os.close(fd)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    wait_for(lambda: pids(mark), 5, what="the prestarted master's pid")
    assert all(gone(pid) for pid in pids(mark))


def cmdline(p: psutil.Process) -> list[str]:
    """Its command line; none for a process gone meanwhile (a fork server's middle process
    exits as soon as it has forked its worker)."""
    try:
        return p.cmdline()
    except psutil.NoSuchProcess:
        return []


@pytest.mark.slow
@pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux only")
def test_the_watchdog_adopts_the_master_herder_run_started(
    herder, jobs, redis_url: str, marked: tuple[dict[str, str], Path]
) -> None:
    env, mark = marked
    env["HERDER_ON_EVENT_URL"] = "http://127.0.0.1:1/secret-hook"
    env["HERDER_HTTP_TOKEN"] = "secret-token"
    h = herder(env=env, workers="1", log_level="debug")
    h.wait_workers(1)
    master = h.master()
    assert master is not None
    assert pids(mark) == [master.pid], "one master: the one herder run started"
    h.wait_log(rf"master {master.pid} was started before the watchdog loaded \(herder run\)")
    # What it started with (what /proc shows of its environment, but for setproctitle): no secret.
    assert (
        started(mark)[master.pid]
        and not {"HERDER_ON_EVENT_URL", "HERDER_HTTP_TOKEN"} & started(mark)[master.pid]
    )
    # Its template and workers still retitle themselves (its environment was replaced): only
    # the master reads as one (`pkill -f herder.supervisor` must reach nothing else).
    pytest.importorskip("setproctitle")
    as_master = [p.pid for p in h.processes() if cmdline(p)[-2:] == ["-m", "herder.supervisor"]]
    assert as_master == [master.pid]
    job = jobs.enqueue("record", "prestarted")
    jobs.wait_finished(job.id, 15, "a job done by the prestarted master's worker")
    h.stop_and_check()


@pytest.mark.slow
@pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux only")
def test_a_prestarted_master_that_dies_loading_is_replaced_by_the_watchdogs(
    herder, jobs, marked: tuple[dict[str, str], Path]
) -> None:
    env, mark = marked
    env["PRESTART_DIE"] = "1"
    h = herder(env=env, workers="1")
    h.wait_workers(1)
    first, *later = pids(mark)
    master = h.master()
    assert master is not None and later and master.pid == later[-1] and gone(first)
    job = jobs.enqueue("record", "replaced")
    jobs.wait_finished(job.id, 15, "a job done by the watchdog's master")
    h.stop_and_check()
