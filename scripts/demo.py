"""herder in one minute: run by scripts/demo, which sets up the machine first.

Starts herder on its embedded Redis with the example jobs in examples/, enqueues a burst,
shows the fleet in a live status view, kills one busy worker (kill -9) and freezes another
(SIGSTOP), and ends with a summary: jobs done, failed by the job itself, lost (0), and
each worker restart with its reason. Then it stops herder cleanly. The dashboard is on the whole
time (--http, 127.0.0.1:9100 unless that port is taken): open it to see the kill and the freeze
marked on the chart; at a terminal, herder waits for Enter before it stops, so you can look.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus

REPO = Path(__file__).resolve().parent.parent
HERDER = str(Path(sys.executable).with_name("herder"))


def herder(state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HERDER, *args, "--state-dir", str(state)], capture_output=True, text=True, timeout=30
    )


def status_view(state: Path, note: str, tty: bool) -> dict | None:
    out = herder(state, "status")
    if tty:
        print("\033[2J\033[H", end="")
    print(out.stdout.rstrip())
    if note:
        print(f"\n>>> {note}")
    print(flush=True)
    as_json = herder(state, "status", "--json")
    if as_json.returncode in (0, 3):
        import json

        return json.loads(as_json.stdout)
    return None


def dashboard_address(wanted: str) -> str:
    """`wanted` (ADDR:PORT) if its port is free, else the same address on a free port."""
    host, _, port = wanted.rpartition(":")
    with socket.socket() as probe:
        try:
            probe.bind((host, int(port)))
            return wanted
        except OSError:
            probe.bind((host, 0))
            return f"{host}:{probe.getsockname()[1]}"


def busy_worker(st: dict | None, exclude: set[int]) -> int | None:
    for w in (st or {}).get("workers", []):
        if w["state"] == "busy" and w["pid"] not in exclude:
            return w["pid"]
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=60)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--http", default="127.0.0.1:9100", help="where the dashboard is served")
    args = p.parse_args()
    http = dashboard_address(args.http)
    tty = sys.stdout.isatty()
    base = Path(tempfile.mkdtemp(prefix="herder-demo-"))
    state = base / "state"
    log_path = base / "herder.log"
    print(f"herder demo: state dir {state}, log {log_path}", flush=True)
    print(f"herder demo: the dashboard is on http://{http}/ (open it now)", flush=True)
    log = open(log_path, "wb")  # noqa: SIM115 - closed at the end
    proc = subprocess.Popen(
        [
            HERDER,
            "run",
            "--state-dir",
            str(state),
            "--path",
            str(REPO / "examples"),
            "--workers",
            str(args.workers),
            "--heartbeat-timeout",
            "3",
            "--kill-timeout",
            "1",
            "--http",
            http,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    stopped_pid: int | None = None
    try:
        deadline = time.monotonic() + 30
        while herder(state, "status").returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text()[-3000:])
                print("herder did not come up; see the log above", file=sys.stderr)
                return 1
            time.sleep(0.3)
        redis = Redis.from_url(f"unix://{state}/redis.sock?db=0")
        q = Queue(connection=redis)
        ids = []
        for i in range(args.jobs):
            if i % 6 == 5:
                ids.append(q.enqueue("jobs.flaky", f"item-{i}").id)
            else:
                ids.append(
                    q.enqueue("jobs.resize_image", f"photo-{i}.jpg", round(random.uniform(0.3, 1.2), 2)).id
                )
        note = f"enqueued {args.jobs} example jobs"
        killed: int | None = None
        started = time.monotonic()
        while True:
            st = status_view(state, f"{note}\n    dashboard: http://{http}/", tty)
            elapsed = time.monotonic() - started
            if killed is None and elapsed > 2 and (pid := busy_worker(st, set())):
                os.kill(pid, signal.SIGKILL)
                killed = pid
                note = f"kill -9 worker {pid} in the middle of a job: it is replaced, its job requeued"
            elif killed and stopped_pid is None and elapsed > 4 and (pid := busy_worker(st, {killed})):
                os.kill(pid, signal.SIGSTOP)  # frozen: alive, but silent
                stopped_pid = pid
                note = (
                    f"SIGSTOP worker {pid} (frozen mid-job): killed after the 3 s heartbeat timeout, "
                    "job requeued"
                )
            jobs = Job.fetch_many(ids, connection=redis)
            ended = [
                j for j in jobs if j and j.get_status(refresh=False) in (JobStatus.FINISHED, JobStatus.FAILED)
            ]
            # Done when every job ended and the frozen worker has been replaced.
            text = log_path.read_text(errors="replace")
            frozen_done = stopped_pid is not None and re.search(rf"pid {stopped_pid}: \w+ -> exited", text)
            if len(ended) == len(ids) and (frozen_done or (stopped_pid is None and elapsed > 30)):
                break
            if elapsed > 120:
                print("demo: jobs did not finish within 120 s", file=sys.stderr)
                break
            time.sleep(1.0)
        jobs = Job.fetch_many(ids, connection=redis)
        finished = sum(1 for j in jobs if j and j.get_status(refresh=False) == JobStatus.FINISHED)
        failed = sum(1 for j in jobs if j and j.get_status(refresh=False) == JobStatus.FAILED)
        lost = len(ids) - finished - failed
        text = log_path.read_text(errors="replace")
        # One line per worker exit: "slot S pid P: busy -> exited (how; why; lived ...)".
        restarts = re.findall(r"slot (\d+) pid (\d+): \w+ -> exited \((.*)\)$", text, re.MULTILINE)
        requeued = len(re.findall(r"requeued at the front of its queue", text))
        print("=" * 72)
        print(f"jobs enqueued:    {len(ids)}")
        print(f"finished:         {finished}")
        print(f"failed:           {failed}   (jobs.flaky raises on purpose, one time in five)")
        print(f"lost:             {lost}")
        print(f"requeued:         {requeued}   (the jobs the killed and the frozen worker held)")
        print("worker restarts:")
        for slot, pid, detail in restarts:
            how, *why, _lived = detail.split("; ")
            print(f"  slot {slot}, pid {pid}: {how}, {'; '.join(why)}")
        print("=" * 72)
        if tty:
            input(f"the dashboard at http://{http}/ shows each of these on its chart; Enter stops herder ")
        return 0 if lost == 0 else 1
    finally:
        if stopped_pid:
            try:
                os.kill(stopped_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            herder(state, "stop")
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        print(f"herder stopped (exit {proc.returncode}); the full log is {log_path}")
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
