"""The launch bound: how soon herder's process tree could do its first job at best, beside
`rq worker-pool` and `herder run` as it is.

    scripts/bench/run launch --rounds 7 --markdown /tmp/launch.md

herder's launch -> first job done is held to be no slower than rq worker-pool's. The main
comparison measures both; this scenario says what the gap is made of. On one private Redis, round
by round (contenders taking turns, so drift in the machine's speed hits all alike), each
launch with `--jobs` no-op jobs queued first, it times the first job's `ended_at` from the
moment the contender is started:

- `rq worker-pool -w rq.worker.SimpleWorker`: one interpreter imports rq and forks;
- `herder run`, as it is (from a byte-compiled snapshot, as the main bench runs it);
- herder's tree, nothing in series but interpreters (bench_launch_chain.py): a stand-in for
  `herder run` starts the master as its first act, the master starts the template as its first
  act, and the template forks the workers itself; what `herder run` -> master -> template
  costs at the least, whatever else is made faster;
- one interpreter: herder's worker forked from a process that imported it, rq's pool's shape
  (no watchdog, master or template).

Not a test, and no assertion: run by hand; docs/benchmarks.md ("Launch") reads a run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from redis import Redis
from rq import Queue

from bench_base import BenchError, median, say, wait_for
from bench_commands import herder_argv, rq_pool_argv
from bench_launch_chain import ENV_LAUNCH, ROLE_ARGV
from bench_procs import Processes, become_subreaper, child_env, end_all, start_redis
from bench_report import publish
from bench_source import herder_digest, snapshot_herder

SUMMARY = "the launch bound of herder's process tree, beside rq"
QUEUE = "herder-launch"
JOB_SOURCE = "def noop():\n    return None\n"
CONTENDERS = {
    "rq": "rq worker-pool -w rq.worker.SimpleWorker",
    "herder": "herder run",
    "chain": "herder's tree, nothing in series but interpreters",
    "single": "one interpreter forks herder's workers",
}


def argv_of(key: str, url: str, tmp: Path, workers: int, n: int) -> list[str]:
    if key == "rq":
        return rq_pool_argv(
            url, workers=workers, queue=QUEUE, path=tmp / "jobs", worker_class="rq.worker.SimpleWorker"
        )
    if key == "herder":
        return herder_argv(url, workers=workers, queue=QUEUE, path=tmp / "jobs", state_dir=tmp / f"state-{n}")
    return [*ROLE_ARGV, "run" if key == "chain" else "single"]


def chain_env(url: str, tmp: Path, workers: int, herder_src: Path) -> dict[str, str]:
    """The environment of the stand-ins: the configuration `herder run` would resolve, and what
    each worker gets from its master (herder.supervisor.children.launcher.worker_env)."""
    from herder.common.config import ENV_RESOLVED, Config
    from herder.supervisor.children.launcher import worker_env

    cfg = replace(Config(), redis_url=url, queues=[QUEUE], paths=[str(tmp / "jobs")], workers=workers)
    env = child_env()
    env["PYTHONPATH"] = str(herder_src)
    env[ENV_RESOLVED] = cfg.to_json()
    from_master = {
        k: v for k, v in worker_env(cfg, 0).items() if k.startswith("HERDER_") or k == "PYTHONUNBUFFERED"
    }
    env[ENV_LAUNCH] = json.dumps({"workers": workers, "env": {**env, **from_master}})
    return env


def launch_once(key: str, argv: list[str], env: dict[str, str], r: Redis, procs: Processes,
                spare: set[int], tmp: Path, jobs: int, timeout: float) -> float:  # fmt: skip
    """Queue the jobs, start the contender, return ms from its start to the first job's end."""
    r.flushdb()
    q = Queue(QUEUE, connection=r)
    for _ in range(jobs):
        q.enqueue("launch_jobs.noop")
    started = time.time()
    proc = procs.start(argv, tmp / f"{key}.log", env)
    try:
        done = wait_for(f"{key}'s first job", lambda: r.zrange(f"rq:finished:{QUEUE}", 0, -1) or None,
                        timeout, interval=0.005)  # fmt: skip
        ends = [q.fetch_job(j.decode()).ended_at for j in done]
        return 1000 * (min(e.timestamp() for e in ends if e) - started)
    finally:
        procs.stop(proc, 10, spare=spare)  # the whole tree, whatever its stop left; not Redis


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=7, help="launches per contender (the median is reported)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--jobs", type=int, default=20, help="no-op jobs queued before each launch")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a launch may take to do a job")
    p.add_argument("--markdown", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    become_subreaper()
    tmp = Path(tempfile.mkdtemp(prefix="herder-launch-"))
    (tmp / "jobs").mkdir()
    (tmp / "jobs" / "launch_jobs.py").write_text(JOB_SOURCE)
    procs = Processes()
    times: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    server = None
    try:
        server, r = start_redis(tmp, procs)
        herder_src = snapshot_herder(tmp / "herder-src")
        say(f"herder from a snapshot of its source (digest {herder_digest(herder_src)}); redis {server.url}")
        envs = {k: child_env() for k in CONTENDERS}
        envs["herder"]["PYTHONPATH"] = str(herder_src)
        envs["chain"] = envs["single"] = chain_env(server.url, tmp, args.workers, herder_src)
        for n in range(args.rounds):
            for key in CONTENDERS:
                argv = argv_of(key, server.url, tmp, args.workers, n)
                ms = launch_once(key, argv, envs[key], r, procs, {server.pid}, tmp, args.jobs, args.timeout)
                times[key].append(ms)
                time.sleep(0.3)  # let the machine settle after the stop
            took = ", ".join(f"{k} {times[k][-1]:.0f} ms" for k in CONTENDERS)
            say(f"round {n + 1}/{args.rounds}: {took}")
    except BenchError as exc:
        say(f"error: {exc}; logs kept in {tmp}")
        return 1
    finally:
        end_all(procs, server)
    rq = median(times["rq"])
    lines = [
        "## Launch: the bound of herder's process tree",
        "",
        f"Command: `scripts/bench/run launch --rounds {args.rounds} --workers {args.workers} "
        f"--jobs {args.jobs}`. "
        f"launch -> first job done: from starting the contender to the first job's `ended_at`, {args.jobs} "
        f"no-op jobs queued first, {args.workers} workers; contenders take turns round by round.",
        "",
        "| contender | launch -> first job done (median) | / rq worker-pool | every launch, ms |",
        "|---|---:|---:|---|",
    ]
    for key, name in CONTENDERS.items():
        m = median(times[key])
        lines.append(f"| {name} | {m:.0f} ms | {m / rq:.2f}x | {', '.join(f'{x:.0f}' for x in times[key])} |")
    publish("\n".join(lines) + "\n", args.markdown)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
