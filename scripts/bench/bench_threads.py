"""Many I/O-bound jobs at once: herder's threaded workers beside one-job workers and `rq worker-pool`.

    scripts/bench/run threads --markdown /tmp/threads.md

For each contender in turn, on a fresh private Redis: the pool is started with `--concurrency`
job slots (herder: `--workers W --threads T` with W x T slots, and W one-job workers; rq's
pool: `-n` workers, its default class), the bench waits until that many RQ workers are
registered, then measures the idle tree's memory (USS and PSS summed over every process, the
supervising ones included), enqueues `--jobs` jobs that each sleep `--job-s` (waiting on I/O,
as an HTTP call does) and times them until the last has finished; the supervising process's CPU
(herder's master, rq's pool process) over that run is read from the kernel's CPU clock of it.

Not a test, and no assertion: run by hand; docs/benchmarks.md ("Threads") reads a run.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import time
from pathlib import Path

import psutil
from rq import Queue

from bench_base import BenchError, wait_for
from bench_commands import herder_argv, herder_master, rq_pool_argv
from bench_contenders import wait_registered
from bench_cpu import process_cpu
from bench_procs import Processes, start_redis
from bench_report import key_table, publish
from bench_source import run_each, scratch

SUMMARY = "I/O-bound jobs: threaded workers beside one-job ones"
QUEUE = "default"
JOB_SOURCE = '''"""Written by scripts/bench threads: a job that waits, as one calling a slow service does."""
import time


def wait(seconds):
    time.sleep(seconds)
'''
MB = 1024 * 1024


def contenders(concurrency: int, threads: int) -> dict[str, str]:
    workers = concurrency // threads
    return {
        "herder-threads": f"herder run --workers {workers} --threads {threads}",
        "herder": f"herder run --workers {concurrency}",
        "rq": f"rq worker-pool -n {concurrency}",
    }


def argv_of(key: str, url: str, tmp: Path, concurrency: int, threads: int) -> list[str]:
    if key == "rq":
        return rq_pool_argv(url, workers=concurrency, queue=QUEUE, path=tmp / "jobs")
    workers, per = (concurrency // threads, threads) if key == "herder-threads" else (concurrency, 1)
    return herder_argv(url, workers=workers, threads=per, workers_limit=max(workers, 1), queue=QUEUE,
                       path=tmp / "jobs", state_dir=tmp / f"state-{key}", scheduler=False)  # fmt: skip


def tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    return []


def supervisor_of(key: str, top: int) -> psutil.Process:
    """herder's master, or rq's pool process."""
    if key == "rq":
        return psutil.Process(top)
    master = herder_master(top)
    if master is None:
        raise BenchError("no herder master found")
    return master


def memory(top: int) -> tuple[float, float, int]:
    """USS and PSS summed over the tree, in MB, and how many processes it has."""
    uss = pss = 0.0
    procs = tree(top)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            m = p.memory_full_info()
            uss, pss = uss + m.uss / MB, pss + m.pss / MB
    return uss, pss, len(procs)


def run_one(key: str, args: argparse.Namespace, tmp: Path, env: dict[str, str], procs: Processes) -> dict:
    server, r = start_redis(tmp / f"redis-{key}", procs)
    log = tmp / f"{key}.log"
    proc = procs.start(argv_of(key, server.url, tmp, args.concurrency, args.threads), log, env)
    try:
        wait_registered(r, args.concurrency, proc, log, args.timeout)
        time.sleep(2.0)  # settled: the last ones' start-up done before memory is read
        uss, pss, count = memory(proc.pid)
        sup = supervisor_of(key, proc.pid)
        cpu0 = process_cpu(sup)
        q = Queue(QUEUE, connection=r)
        started = time.monotonic()
        with r.pipeline() as pipe:
            q.enqueue_many([Queue.prepare_data("bench_io.wait", (args.job_s,), result_ttl=600)
                            for _ in range(args.jobs)], pipeline=pipe)  # fmt: skip
            pipe.execute()
        wait_for(
            f"{args.jobs} jobs finished ({key})",
            lambda: r.zcard(f"rq:finished:{QUEUE}") >= args.jobs or None,
            args.timeout,
            0.05,
        )
        took = time.monotonic() - started
        cpu = process_cpu(sup) - cpu0
        return {
            "jobs/s": round(args.jobs / took, 1),
            "seconds": round(took, 2),
            "processes": count,
            "USS, MB": round(uss, 1),
            "PSS, MB": round(pss, 1),
            "supervisor CPU, ms": round(cpu * 1000),
        }
    finally:
        procs.stop(proc, 30)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, default=64, help="job slots of each contender")
    p.add_argument("--threads", type=int, default=16, help="herder-threads: threads per worker")
    p.add_argument("--jobs", type=int, default=400, help="jobs, all enqueued at once")
    p.add_argument("--job-s", type=float, default=1.0, help="each job's wait")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each wait may take")
    p.add_argument("--only", help="comma-separated contenders: herder-threads,herder,rq")
    p.add_argument("--markdown", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    names = contenders(args.concurrency, args.threads)
    keys = args.only.split(",") if args.only else list(names)
    tmp = scratch("herder-threads-", "bench_io.py", JOB_SOURCE)
    results = run_each(keys, tmp, lambda key, env, procs: run_one(key, args, tmp, env, procs))
    if results is None:
        return 1
    lines = [
        "## Threads: many I/O-bound jobs in few processes",
        "",
        f"Command: `scripts/bench/run threads --concurrency {args.concurrency} --threads {args.threads} "
        f"--jobs {args.jobs} --job-s {args.job_s:g}`. {args.jobs} jobs that each wait {args.job_s:g} s, "
        f"{args.concurrency} at once; memory summed over every process of the idle pool once all "
        f"{args.concurrency} RQ workers are registered; the supervisor's CPU over the run.",
        "",
        *key_table({k: names[k] for k in keys}, results, list(next(iter(results.values())))),
    ]
    if "herder-threads" in results and "herder" in results:
        t, one = results["herder-threads"], results["herder"]
        lines += [
            "",
            f"herder-threads against herder's one-job workers: "
            f"throughput {t['jobs/s'] / one['jobs/s']:.2f}x, "
            f"USS {t['USS, MB'] / one['USS, MB']:.2f}x, PSS {t['PSS, MB'] / one['PSS, MB']:.2f}x.",
        ]
    publish("\n".join(lines) + "\n", args.markdown)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
