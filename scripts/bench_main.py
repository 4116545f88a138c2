"""scripts/bench's command line, and the run: herder against `rq worker-pool`, on one private Redis.

Two measurements, each at equal worker counts: throughput (bench_throughput.py) and crash to
replacement (bench_crash.py); see docs/benchmarks.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from bench_base import REPO, BenchError, Findings, Interrupted, say
from bench_contenders import HERDER_MIN_UPTIME, Launcher
from bench_cpu import Noise
from bench_crash import CrashTest
from bench_facts import machine_facts
from bench_procs import Processes, RedisServer, become_subreaper, end_all
from bench_report import publish, render
from bench_source import herder_digest, snapshot_herder
from bench_throughput import ThroughputTest


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark herder against `rq worker-pool` (throughput, crash-to-replacement latency).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--workers", type=int, default=4, help="workers per pool, the same for every contender")
    p.add_argument("--jobs", type=int, default=2000, help="no-op jobs per throughput round")
    p.add_argument(
        "--rounds", type=int, default=3, help="throughput rounds per contender (the median is reported)"
    )
    p.add_argument("--kills", type=int, default=10, help="workers killed per contender in the crash test")
    p.add_argument("--markdown", metavar="PATH", help="also write the report to this file")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-crash", action="store_true")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    p.add_argument(
        "--bin-dir",
        default=os.path.dirname(sys.executable),
        help="where the `herder` and `rq` commands are (by default next to this Python)",
    )
    p.add_argument(
        "--poll-interval", type=float, default=0.002, help="seconds between polls in the crash test"
    )
    p.add_argument("--settle", type=float, default=0.5, help="seconds of idle pool before each kill")
    p.add_argument(
        "--min-age",
        type=float,
        default=HERDER_MIN_UPTIME + 0.5,
        help="only kill workers at least this old (herder backs off on workers dying within --min-uptime)",
    )
    p.add_argument(
        "--round-timeout", type=float, default=300.0, help="give up on a throughput round after this"
    )
    p.add_argument(
        "--stop-timeout", type=float, default=30.0, help="seconds a pool may take to stop on SIGTERM"
    )
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.25,
        help="flag a run as noisy when other processes used more CPU than this (cores, on average)",
    )
    p.add_argument(
        "--snapshot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run herder from a copy of its source taken at the start (immune to edits during the run)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="before each run, wait up to this long for other processes to use less than --max-other-load",
    )
    p.add_argument(
        "--keep-tmp", action="store_true", help="keep the temp dir (logs); it is kept anyway on problems"
    )
    args = p.parse_args(argv)
    if args.workers < 1 or args.jobs < 1 or args.rounds < 1 or args.kills < 1:
        p.error("--workers, --jobs, --rounds and --kills must be at least 1")
    for tool in ("herder", "rq"):
        if not os.access(Path(args.bin_dir) / tool, os.X_OK):
            p.error(f"no `{tool}` in {args.bin_dir}; pass --bin-dir")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command = shlex.join([os.environ.get("HERDER_BENCH_ARGV0", sys.argv[0]), *argv])
    if not sys.platform.startswith("linux"):
        say("Linux only (psutil children, prctl subreaper, process groups)")
        return 2

    def on_signal(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    if not become_subreaper():
        say("warning: could not become a child subreaper; orphaned workers may escape the cleanup")

    tmp = Path(tempfile.mkdtemp(prefix="herder-bench-"))
    procs = Processes()
    server = RedisServer(args.redis_server, tmp, procs)
    findings = Findings()
    code = 0
    try:
        conn = server.start()
        herder_src = snapshot_herder(tmp / "herder-src") if args.snapshot else None
        launcher = Launcher(args, tmp, procs, server, herder_src, findings)
        say(f"redis-server pid {server.pid} on {server.url}; logs in {tmp}")
        digest = herder_digest(herder_src or REPO)
        if herder_src:
            say(f"herder runs from a snapshot of its source (digest {digest}) in {herder_src}")
        facts = machine_facts(conn, launcher.bindir, digest)
        noise = Noise(args.quiet_wait, args.max_other_load, findings)
        thr = {} if args.skip_throughput else ThroughputTest(args, conn, launcher, noise, findings).run()
        crash = {} if args.skip_crash else CrashTest(args, conn, launcher, noise, findings).run()
        if herder_digest(REPO) != digest:
            note = (
                f"herder's source in the working tree changed during the run (digest {digest} -> "
                f"{herder_digest()})"
            )
            if herder_src:
                findings.warnings.append(f"{note}; every run used the snapshot taken at the start")
            else:
                findings.problems.append(f"{note}: some runs measured different code")
        publish(render(args, command, facts, thr, crash, findings.problems, findings.warnings), args.markdown)
        code = 1 if findings.problems else 0
    except (KeyboardInterrupt, Interrupted) as exc:
        say(f"interrupted ({exc.__class__.__name__} {exc}): cleaning up")
        code = 130
    except BenchError as exc:
        say(f"error: {exc}")
        code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the cleanup must not be cut short
        end_all(procs, server)
        if code == 0 and not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            say(f"logs kept in {tmp}")
    return code
