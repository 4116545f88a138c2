"""The main comparison (scripts/bench/run with no scenario): herder against `rq worker-pool` and
supervisord + `rq worker`, on one private Redis.

The measurements, each at equal worker counts: throughput (bench_throughput.py) with the
floor beside it (the least a reliable Redis queue does per job, bench_floor.py), crash to
replacement, also under full CPU load (bench_crash.py), start-up, memory and stop of an idle
pool (bench_idle.py), and herder at several pool sizes (bench_scaling.py); the report, with
the targets herder is held to, is bench_report.py. See docs/benchmarks.md for what is
measured and how.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench_base import REPO, BenchError, Findings, Interrupted, UsageError, say
from bench_contenders import ALL_CONTENDERS, BY_KEY, HERDER_MIN_UPTIME, Launcher
from bench_cpu import Noise
from bench_crash import CrashTest
from bench_facts import machine_facts
from bench_floor import FLOOR_KEY
from bench_floor import command as floor_command
from bench_idle import IdleTest
from bench_procs import Processes, RedisServer, end_all, raise_open_files, take_charge
from bench_report import publish, render
from bench_scaling import ScalingTest
from bench_source import herder_digest, snapshot_herder
from bench_throughput import ThroughputTest

ALL_KEYS = ",".join(c.key for c in ALL_CONTENDERS)


def sizes(text: str) -> list[int]:
    """ "4,16,64,256" -> [4, 16, 64, 256]; "" -> []."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of pool sizes: {text!r}") from None
    if any(x < 1 for x in out):
        raise argparse.ArgumentTypeError("pool sizes must be at least 1")
    return out


DESCRIPTION = """\
Benchmark herder against `rq worker-pool` and supervisord + `rq worker`: throughput (beside
the floor, a bare Redis queue loop), crash to replacement (also under full CPU load), start-up,
memory and stop of idle pools, scaling, and the targets herder is held to. That is the main
comparison, run when no scenario is named; the options below are its own. A scenario runs
instead with `scripts/bench/run SCENARIO [options]` (`scripts/bench/run SCENARIO --help`)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4, help="workers per pool, the same for every contender")
    p.add_argument(
        "--jobs", type=int, default=2000, help="no-op jobs per throughput round (the floor gets as many)"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="throughput rounds per contender (the median is reported)"
    )
    p.add_argument("--kills", type=int, default=10, help="workers killed per contender in the crash test")
    p.add_argument(
        "--load-kills",
        type=int,
        default=5,
        help="workers killed per contender in the crash test under CPU load",
    )
    p.add_argument(
        "--idle-runs", type=int, default=3, help="idle-pool runs per contender (start-up, memory, stop)"
    )
    p.add_argument(
        "--idle-settle", type=float, default=1.0, help="seconds a ready pool idles before its memory is read"
    )
    p.add_argument(
        "--scale-sizes",
        type=sizes,
        default=[4, 16, 64, 256],
        help="pool sizes of the scaling table, comma-separated (empty: no scaling table); herder gets "
        "--workers-limit N above 16",
    )
    p.add_argument(
        "--scale-contenders",
        default="herder,rq-simple,supervisord",
        help="contenders in the scaling table, comma-separated keys",
    )
    p.add_argument(
        "--scale-peers-max",
        type=int,
        default=64,
        help="the peers among --scale-contenders (all but herder's variants) run only at pool sizes up to "
        "this (0: at every size); herder's variants run at every size",
    )
    p.add_argument(
        "--scale-runs",
        type=int,
        default=3,
        help="scaling: runs of each size for herder's variants, in rounds (the peers run once); a row "
        "is the median run, a target the median of the rounds' ratios",
    )
    p.add_argument(
        "--scale-jobs-min",
        type=int,
        default=10000,
        help="scaling: jobs per run, at least (enough for a few seconds at any size: the master's "
        "once-a-second and every-few-seconds work falls into every size's run)",
    )
    p.add_argument(
        "--scale-jobs-per-worker", type=int, default=100, help="scaling: jobs per run, per worker (if more)"
    )
    p.add_argument(
        "--contenders", default=ALL_KEYS, help=f"which contenders run, comma-separated keys (of {ALL_KEYS})"
    )
    p.add_argument(
        "--herder-args",
        default="",
        metavar="ARGS",
        help="more arguments for `herder run`, one string (shell-quoted), appended to its command line",
    )
    p.add_argument("--markdown", metavar="PATH", help="also write the report to this file")
    p.add_argument(
        "--skip-throughput", action="store_true", help="skip the throughput rounds (and the floor)"
    )
    p.add_argument(
        "--skip-floor",
        action="store_true",
        help="leave the floor (a bare Redis queue loop, bench_floor.py) out of the throughput rounds",
    )
    p.add_argument("--skip-crash", action="store_true", help="skip the crash test (without load)")
    p.add_argument("--skip-load-crash", action="store_true", help="skip the crash test under full CPU load")
    p.add_argument("--skip-busy-crash", action="store_true", help="skip the crash test after a busy spell")
    p.add_argument(
        "--skip-noisy-crash", action="store_true", help="skip the crash test under noisy full load"
    )
    p.add_argument(
        "--busy-jobs", type=int, default=4000, help="no-op jobs of the busy spell before the busy crash test"
    )
    p.add_argument("--skip-idle", action="store_true", help="skip the idle pools (start-up, memory, stop)")
    p.add_argument("--skip-scaling", action="store_true", help="skip the scaling table")
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
        "--round-timeout",
        type=float,
        default=300.0,
        help="give up on a throughput round after this many seconds (a scaling run: this x its jobs / "
        "--jobs, if more)",
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


def check(args: argparse.Namespace) -> None:
    """What argparse cannot check alone; fills in --skip-scaling."""
    counts = (
        args.workers,
        args.jobs,
        args.rounds,
        args.kills,
        args.load_kills,
        args.idle_runs,
        args.scale_runs,
    )
    if min(counts) < 1:
        raise UsageError(
            "--workers, --jobs, --rounds, --kills, --load-kills, --idle-runs and --scale-runs "
            "must be at least 1"
        )
    if args.scale_peers_max < 0:
        raise UsageError("--scale-peers-max must be 0 (no limit) or more")
    for option in ("contenders", "scale_contenders"):
        unknown = [k for k in getattr(args, option).split(",") if k.strip() and k.strip() not in BY_KEY]
        if unknown:
            raise UsageError(
                f"--{option.replace('_', '-')}: unknown {', '.join(unknown)} (known: {ALL_KEYS})"
            )
    if args.skip_scaling:
        args.scale_sizes = []
    for tool in ("herder", "rq"):
        if not os.access(Path(args.bin_dir) / tool, os.X_OK):
            raise UsageError(f"no `{tool}` in {args.bin_dir}; pass --bin-dir")


def run(args: argparse.Namespace) -> int:
    check(args)
    command = shlex.join([os.environ.get("HERDER_BENCH_ARGV0", sys.argv[0]), *sys.argv[1:]])
    if not sys.platform.startswith("linux"):
        say("Linux only (psutil children, prctl subreaper, process groups)")
        return 2
    take_charge()

    started = time.monotonic()
    # Pools of hundreds of workers hold thousands of pipes and Redis connections.
    files_note = raise_open_files(max([args.workers, *args.scale_sizes]))
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
        if files_note:
            facts["open files limit (RLIMIT_NOFILE)"] = files_note
        say("contenders: " + "; ".join(c.label for c in launcher.contenders))
        noise = Noise(args.quiet_wait, args.max_other_load, findings)
        scenario = (args, conn, launcher, noise, findings)
        results = {
            "throughput": {} if args.skip_throughput else ThroughputTest(*scenario).run(),
            "crash": {} if args.skip_crash else CrashTest(*scenario).run(),
            "busy": {} if args.skip_busy_crash else CrashTest(*scenario, mode="busy").run(),
            "noisy": {} if args.skip_noisy_crash else CrashTest(*scenario, mode="noisy").run(),
            "load": {} if args.skip_load_crash else CrashTest(*scenario, mode="load").run(),
            "idle": {} if args.skip_idle else IdleTest(*scenario).run(),
            "scaling": ScalingTest(*scenario).run() if args.scale_sizes else {},
        }
        if herder_digest(REPO) != digest:
            note = (
                f"herder's source in the working tree changed during the run (digest {digest} -> "
                f"{herder_digest()})"
            )
            if herder_src:
                findings.warnings.append(f"{note}; every run used the snapshot taken at the start")
            else:
                findings.problems.append(f"{note}: some runs measured different code")
        facts["bench duration"] = f"{(time.monotonic() - started) / 60:.1f} min"
        commands = {c.key: launcher.command(c) for c in launcher.contenders}
        commands[FLOOR_KEY] = floor_command(server.url)
        report = render(args, command, facts, launcher.contenders, commands, results, findings)
        publish(report, args.markdown)
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
