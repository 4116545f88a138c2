"""One herder worker's CPU per no-op job, measured without the noise of a shared machine.

    .venv/bin/python scripts/profile_worker.py                 # callgrind: instructions a job
    .venv/bin/python scripts/profile_worker.py --py-spy out.svg  # where the time goes

The worker is herder's own (the fast path's HerderFastWorker, RQ's worker with herder's
protocol), run as the master runs it: its protocol lines on a pipe (drained here), RQ's log
lines at INFO through herder's handler, unbuffered, on a private redis-server. It runs a burst
of no-op jobs queued before it starts, and exits when the queue is empty.

callgrind counts instructions, so the figure does not move with the machine's load. The
worker's start-up (Python, RQ, the first jobs, the start template) is taken out by running
twice, with `--warmup` jobs and with `--warmup` + `--jobs`: the difference over `--jobs` is the
cost of one job in the steady state. PYTHONHASHSEED is pinned so the two runs take the same path.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUEUE = "herder-bench"
JOB_MODULE = "herder_bench_jobs"
JOB_FUNC = f"{JOB_MODULE}.noop"  # the throughput bench's job (bench_contenders.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A private redis-server on a free loopback port."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        from redis import Redis as Client

        self.client = Client(port=self.port)
        for _ in range(200):
            try:
                self.client.ping()
                return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def enqueue(client: object, n: int) -> None:
    from rq import Queue

    q = Queue(QUEUE, connection=client)  # type: ignore[arg-type]
    for start in range(0, n, 500):
        datas = [Queue.prepare_data(JOB_FUNC) for _ in range(min(500, n - start))]
        with client.pipeline() as pipe:  # type: ignore[attr-defined]
            q.enqueue_many(datas, pipeline=pipe)
            pipe.execute()


def child(port: int) -> int:
    """The worker, as herder.worker.__main__ makes it (the Config's defaults), in burst mode."""
    from herder.common.config import Config
    from herder.worker.channel import Channel

    cfg = Config()
    channel = Channel(heartbeat_interval=cfg.heartbeat_interval)
    channel.start()
    from redis import Redis as Client
    from rq import Queue

    from herder.common.redis_connect import bound_calls
    from herder.worker.fast_path.worker import HerderFastWorker
    from herder.worker.rq_worker import log_to_master

    connection = Client(port=port)
    w = HerderFastWorker(
        [Queue(QUEUE, connection=connection)], connection=connection, name=f"profile-{os.getpid()}"
    )
    w.attach(channel, cfg.lease_seconds)
    bound_calls(w.connection, max(cfg.redis_timeout, 2))
    log_format = "%(levelname)s %(message)s"
    log_to_master(log_format)
    w.work(burst=True, logging_level=cfg.log_level.upper(), log_format=log_format)
    channel.stopped()
    return 0


def run_worker(jobs: int, prefix: list[str], workdir: Path) -> tuple[bytes, float]:
    redis = Redis(workdir)
    try:
        enqueue(redis.client, jobs)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0"}
        env["PYTHONPATH"] = os.pathsep.join([str(workdir), env.get("PYTHONPATH", "")])
        argv = [*prefix, sys.executable, "-P", __file__, "--child", str(redis.port)]
        # stdin stays open as the master's pipe does (a worker whose stdin closes stops); its
        # lines go to files, a write each as to the master's pipes.
        stdin_r, stdin_w = os.pipe()
        with open(workdir / "stdout", "wb+") as out, open(workdir / "stderr", "wb+") as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(argv, env=env, stdin=stdin_r, stdout=out, stderr=err)
            os.close(stdin_r)
            try:
                code = proc.wait(3600)
            finally:
                os.close(stdin_w)
            wall = time.monotonic() - t0
            err.seek(0)
            log = err.read()
        left = redis.client.llen(f"rq:queue:{QUEUE}")
        if code != 0 or left or b"stopping after" in log:
            raise RuntimeError(f"worker exit {code}, {left} jobs left: {log[-2000:]!r}")
        return log, wall
    finally:
        redis.stop()


def instructions(out: Path) -> int:
    """The total Ir of a callgrind output file (its `summary:` or `totals:` line)."""
    text = out.read_text()
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if m is None:
        raise RuntimeError(f"no totals in {out}")
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000, help="jobs measured (default 1000)")
    ap.add_argument("--warmup", type=int, default=100, help="jobs in the baseline run (default 100)")
    ap.add_argument(
        "--py-spy", metavar="OUT", help="py-spy instead: a flame graph (.svg) or raw stacks (.txt)"
    )
    ap.add_argument("--rate", type=int, default=250, help="py-spy's samples a second")
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind outputs here")
    ap.add_argument("--child", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)

    with tempfile.TemporaryDirectory(prefix="profile-worker-") as tmp:
        workdir = Path(tmp)
        (workdir / f"{JOB_MODULE}.py").write_text("def noop():\n    return None\n")
        if args.py_spy:
            spy = Path(sys.executable).parent / "py-spy"
            fmt = ["--format", "raw"] if args.py_spy.endswith(".txt") else []
            out = os.path.abspath(args.py_spy)
            prefix = [str(spy), "record", "-r", str(args.rate), "-o", out, *fmt, "--"]
            _, wall = run_worker(args.warmup + args.jobs, prefix, workdir)
            print(f"{args.warmup + args.jobs} jobs in {wall:.1f} s: {args.py_spy}")
            return 0
        keep = Path(args.keep) if args.keep else workdir
        keep.mkdir(parents=True, exist_ok=True)
        counts = []
        for n in (args.warmup, args.warmup + args.jobs):
            out = keep / f"callgrind.{n}.out"
            prefix = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
            _, wall = run_worker(n, prefix, workdir)
            counts.append(instructions(out))
            print(f"{n} jobs: {counts[-1]:,} instructions ({wall:.0f} s under callgrind)", flush=True)
        per_job = (counts[1] - counts[0]) / args.jobs
        print(f"instructions per job: {per_job:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
