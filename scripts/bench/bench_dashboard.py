"""What an open dashboard costs the master: its CPU per 1,000 jobs (and per second idle) with the
page open in a headless Chromium, polling every second, against no page at all.

    scripts/bench/run dashboard --markdown /tmp/dashboard.md

For each pool size (--workers, default 4 and 64) the page is closed, then open, each run on a
fresh private Redis and a fresh `herder run --http`: the bench waits until every worker is
registered; with the page open it loads it in Debian's chromium (selenium, chromium-driver:
the test extra and scripts/setup) and waits until it shows every worker; it then reads the
master's CPU (user + system, the kernel's CPU clock of it) over --idle-s seconds with no job, and over --jobs
no-op jobs enqueued at once, until the last has finished.

Not a test, and no assertion: run by hand; the machine's other load shows in the report.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rq import Queue

from bench_base import BenchError, wait_for
from bench_commands import herder_argv, herder_master
from bench_contenders import wait_registered
from bench_cpu import CpuMeter, process_cpu
from bench_procs import Processes, RedisServer, start_redis
from bench_report import key_table, publish
from bench_source import run_each, scratch

SUMMARY = "the master's CPU with the dashboard open and closed"
QUEUE = "default"
JOB_SOURCE = '''"""Written by scripts/bench dashboard: the job every run does."""


def noop():
    return None
'''
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1400,1300")  # fmt: skip
SHOWN_WORKERS = "return document.querySelectorAll('#workers tbody tr').length;"


def open_page(url: str, workers: int, profile: Path, timeout: float) -> Any:
    """A headless Chromium showing the dashboard at `url`, once it lists every worker."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        raise BenchError(f"the open page needs selenium (the test extra): {exc}") from exc
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(url)
        shown = lambda: driver.execute_script(SHOWN_WORKERS) >= workers or None  # noqa: E731
        wait_for(f"the page to show {workers} workers", shown, timeout, 0.2)
    except BaseException:
        driver.quit()
        raise
    return driver


def run_one(key: str, args: argparse.Namespace, tmp: Path, env: dict[str, str], procs: Processes) -> dict:
    size, page = key.split("-")
    workers = int(size)
    server, r = start_redis(tmp / f"redis-{key}", procs)
    port = RedisServer.free_port()
    argv = herder_argv(server.url, workers=workers, workers_limit=workers, queue=QUEUE, path=tmp / "jobs",
                       state_dir=tmp / f"state-{key}", scheduler=False, http=f"127.0.0.1:{port}")  # fmt: skip
    log = tmp / f"{key}.log"
    proc = procs.start(argv, log, env)
    driver = None
    try:
        wait_registered(r, workers, proc, log, args.timeout)
        if page == "open":
            profile = Path(tempfile.mkdtemp(dir=tmp))  # a fresh profile: no cache
            driver = open_page(f"http://127.0.0.1:{port}/", workers, profile, args.timeout)
        time.sleep(2.0)  # settled: the last workers' start-up, the page's first load
        master = herder_master(proc.pid)
        if master is None:
            raise BenchError(f"no herder master found; see {log}")
        meter = CpuMeter()
        cpu0 = process_cpu(master)
        time.sleep(args.idle_s)
        idle = (process_cpu(master) - cpu0) / args.idle_s
        q = Queue(QUEUE, connection=r)
        cpu0, started = process_cpu(master), time.monotonic()
        for start in range(0, args.jobs, 500):
            with r.pipeline() as pipe:
                q.enqueue_many([Queue.prepare_data("bench_noop.noop", result_ttl=600)
                                for _ in range(min(500, args.jobs - start))], pipeline=pipe)  # fmt: skip
                pipe.execute()
        done = lambda: r.zcard(f"rq:finished:{QUEUE}") >= args.jobs or None  # noqa: E731
        wait_for(f"{args.jobs} jobs finished ({key})", done, args.timeout, 0.05)
        took = time.monotonic() - started
        busy = process_cpu(master) - cpu0
        other = meter.stop()
        return {
            "master CPU idle, ms/s": round(idle * 1000, 1),
            "master CPU per 1,000 jobs, ms": round(busy * 1000 * 1000 / args.jobs),
            "jobs/s": round(args.jobs / took),
            "other processes' load, cores": round(other, 2),
        }
    finally:
        if driver is not None:
            driver.quit()
        procs.stop(proc, 30)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", default="4,64", help="comma-separated pool sizes")
    p.add_argument("--jobs", type=int, default=5000, help="no-op jobs, all enqueued at once")
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds the idle CPU is read over")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each wait may take")
    p.add_argument("--markdown", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.workers.split(",")]
    keys = [f"{n}-{page}" for n in sizes for page in ("closed", "open")]
    tmp = scratch("herder-dashboard-", "bench_noop.py", JOB_SOURCE)
    results = run_each(keys, tmp, lambda key, env, procs: run_one(key, args, tmp, env, procs))
    if results is None:
        return 1
    labels = {f"{n}-{page}": f"{n} workers, page {page}" for n in sizes for page in ("closed", "open")}
    lines = [
        "## The dashboard's cost to the master",
        "",
        f"Command: `scripts/bench/run dashboard --workers {args.workers} --jobs {args.jobs} "
        f"--idle-s {args.idle_s:g}`. `herder run --http` with the page closed, and open in a headless "
        f"Chromium polling every second; the master's CPU over {args.idle_s:g} s idle and over "
        f"{args.jobs} no-op jobs enqueued at once.",
        "",
        *key_table(labels, results, list(next(iter(results.values())))),
    ]
    publish("\n".join(lines) + "\n", args.markdown)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
