"""A flaky network, herder beside `rq worker-pool`: what each loses, runs twice, leaves behind.

    scripts/bench/run network --markdown /tmp/network.md

The scenario of tests/test_network_faults.py, with its fault proxy (tests/faultproxy.py), for
each contender in turn on a fresh private Redis: `--jobs` jobs of `--job-ms` that record their
runs over a connection of their own straight to Redis, `--workers` workers whose every
connection to Redis crosses the proxy; for `--faults` seconds the proxy resets a connection
(sometimes all of them), kills one silently or holds all traffic for 2 s, at random moments
0.3-1.5 s apart, from the same seed for every contender; then the network heals. The bench
waits until the queue is empty and no job has ended for `--settle` seconds (or `--timeout`),
then counts, from Redis: jobs finished, failed, never run, run more than once, left `started`
in a registry or in the intermediate list.

Not a test, and no assertion: run by hand; docs/benchmarks.md ("A flaky network") reads a run.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path

from redis import Redis
from rq import Queue

from bench_base import REPO, say
from bench_commands import herder_argv, rq_pool_argv
from bench_procs import Processes, start_redis
from bench_report import key_table, publish
from bench_source import run_each, scratch

sys.path.insert(0, str(REPO / "tests"))
from faultproxy import FaultProxy  # noqa: E402  (the tests' proxy: the same faults)

SUMMARY = "a flaky network: what herder and rq's pool lose"
QUEUE = "default"
JOB_SOURCE = '''"""Written by scripts/bench network: records each run straight to Redis, past the proxy."""
import time
from redis import Redis

_direct = {}


def tick(n, port, seconds):
    conn = _direct.get(port) or _direct.setdefault(port, Redis(port=port, socket_timeout=10))
    time.sleep(seconds)
    conn.rpush("ran", n)
    return n
'''
CONTENDERS = {
    "herder": "herder run",
    "herder-rq-path": "herder run --no-fast-path",
    "rq": "rq worker-pool -w rq.worker.SimpleWorker",
}


def argv_of(key: str, url: str, tmp: Path, workers: int) -> list[str]:
    if key == "rq":
        return rq_pool_argv(
            url, workers=workers, queue=QUEUE, path=tmp / "jobs", worker_class="rq.worker.SimpleWorker"
        )
    extra = ["--no-fast-path"] if key == "herder-rq-path" else []
    return herder_argv(url, workers=workers, queue=QUEUE, path=tmp / "jobs", state_dir=tmp / f"state-{key}",
                       scheduler=False, extra=extra)  # fmt: skip


def break_things(proxy: FaultProxy, seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(rng.uniform(0.3, 1.5))
        roll = rng.random()
        if roll < 0.55:
            proxy.reset_one()
        elif roll < 0.7:
            proxy.reset_all()
        elif roll < 0.9:
            proxy.silence_one()
        else:
            proxy.stall(2.0)
    proxy.heal()


def count(r: Redis, n: int) -> dict[str, float]:
    ran = [int(x) for x in r.lrange("ran", 0, -1)]
    with r.pipeline() as pipe:
        for i in range(n):
            pipe.hget(f"rq:job:net-{i}", "status")
        statuses = [s.decode() if s else "gone" for s in pipe.execute()]
    return {
        "finished": statuses.count("finished"),
        "failed": statuses.count("failed"),
        "never ran": n - len(set(ran)),
        "ran twice or more": sum(1 for i in set(ran) if ran.count(i) > 1),
        "left started": r.zcard(f"rq:wip:{QUEUE}"),
        "left in the intermediate list": r.llen(f"rq:queue:{QUEUE}:intermediate"),
        "still queued": r.llen(f"rq:queue:{QUEUE}"),
    }


def run_one(key: str, args: argparse.Namespace, tmp: Path, env: dict[str, str], procs: Processes) -> dict:
    server, r = start_redis(tmp / f"redis-{key}", procs)
    port = server.port
    proxy = FaultProxy(port, seed=args.seed)
    q = Queue(QUEUE, connection=r)
    with r.pipeline() as pipe:
        q.enqueue_many(
            [Queue.prepare_data("net_jobs.tick", (i, port, args.job_ms / 1000), job_id=f"net-{i}",
                                result_ttl=3600) for i in range(args.jobs)],
            pipeline=pipe,
        )  # fmt: skip
        pipe.execute()
    proc = procs.start(argv_of(key, proxy.url(), tmp, args.workers), tmp / f"{key}.log", env)
    try:
        time.sleep(2.0)  # the pool up and working before the faults begin, for every contender alike
        break_things(proxy, args.faults, args.seed)
        healed = time.monotonic()
        last, last_change = -1, time.monotonic()
        while time.monotonic() - healed < args.timeout:
            done = r.zcard(f"rq:finished:{QUEUE}") + r.zcard(f"rq:failed:{QUEUE}")
            if done != last:
                last, last_change = done, time.monotonic()
            quiet = time.monotonic() - last_change > args.settle
            if quiet and (r.llen(f"rq:queue:{QUEUE}") == 0 or done == 0):
                break
            time.sleep(0.2)
        result: dict = count(r, args.jobs)
        after = last_change - healed
        ended = round(after, 1) if after > 0 else "none ended after it"
        result["last job ended, s after the healing"] = ended
        result["faults"] = dict(proxy.counts)
        return result
    finally:
        procs.stop(proc, 20)  # the contender's tree and this run's Redis
        proxy.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4, help="workers of each contender")
    p.add_argument("--jobs", type=int, default=3000, help="jobs, all enqueued before the pool starts")
    p.add_argument("--job-ms", type=float, default=40.0, help="each job's sleep")
    p.add_argument("--faults", type=float, default=30.0, help="seconds of faults, then the network heals")
    p.add_argument("--settle", type=float, default=10.0, help="seconds with no job ending that mean done")
    p.add_argument("--timeout", type=float, default=120.0, help="the longest wait after healing")
    p.add_argument(
        "--seed", type=int, default=27, help="of the faults' schedule, the same for each contender"
    )
    p.add_argument("--only", help="comma-separated contenders: " + ",".join(CONTENDERS))
    p.add_argument("--markdown", help="also write the report here")
    p.add_argument("--keep", action="store_true", help="keep the contenders' logs (their folder is said)")


def run(args: argparse.Namespace) -> int:
    keys = args.only.split(",") if args.only else list(CONTENDERS)
    tmp = scratch("herder-network-", "net_jobs.py", JOB_SOURCE)
    results = run_each(keys, tmp, lambda key, env, procs: run_one(key, args, tmp, env, procs))
    if results is None:
        return 1
    rows = [k for k in next(iter(results.values())) if k != "faults"]
    lines = [
        "## A flaky network",
        "",
        f"Command: `scripts/bench/run network --jobs {args.jobs} --job-ms {args.job_ms:g} --workers "
        f"{args.workers} --faults {args.faults:g} --seed {args.seed}`. {args.jobs} jobs of "
        f"{args.job_ms:g} ms, {args.workers} workers; every connection of the contender to Redis "
        f"crosses a fault proxy that, for {args.faults:g} s, resets connections, kills them silently "
        "and stalls traffic (the same schedule for each); the jobs record their runs straight to "
        f"Redis. Counted once no job has ended for {args.settle:g} s after the network healed.",
        "",
        *key_table({k: CONTENDERS[k] for k in keys}, results, rows),
    ]
    faults = ", ".join(f"{k} {v}" for k, v in results[keys[0]]["faults"].items())
    lines += ["", f"Faults ({keys[0]}'s run): {faults}."]
    publish("\n".join(lines) + "\n", args.markdown)
    if args.keep:
        say(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0
