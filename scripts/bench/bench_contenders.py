"""The contenders (herder, with and without its fork server; `rq worker-pool` with two worker
classes; supervisord running `rq worker` processes), the job they all run, and how each pool
is launched, found and stopped: the same way for all of them; and `Scenario`, what each
scenario (bench_throughput.py, bench_crash.py, bench_idle.py, bench_scaling.py) runs them with
(bench_floor.py's floor is no contender: it runs its own processes, in the throughput rounds).

herder is reached only through its command line (`herder run`, `herder scale`), the command
lines of its processes and its logs, never through its modules, which may move.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from redis import Redis
from rq import Worker

from bench_base import BenchError, Findings, wait_for
from bench_cpu import Noise, cpu_by_role
from bench_procs import Processes, RedisServer, child_env

QUEUE = "herder-bench"
JOB_MODULE = "herder_bench_jobs"
JOB_FUNC = f"{JOB_MODULE}.noop"
NOISY_FUNC = f"{JOB_MODULE}.noisy"
JOB_SOURCE = (
    '"""Written by scripts/bench: the job every contender runs."""\n\nimport sys\n\n\ndef noop():\n'
    "    return None\n\n\ndef noisy():\n"
    '    """The noisy load of the crash test: a job that prints, as many do."""\n'
    "    for i in range(20):\n"
    "        print('a line on stdout', i)\n"
    "        print('a line on stderr', i, file=sys.stderr)\n"
)
HERDER_MIN_UPTIME = 1.0  # herder's default --min-uptime: a worker dying younger than this backs off
# herder's master runs as `python -P -m herder.supervisor`.
HERDER_MASTER_PACKAGE = "herder.supervisor"
# supervisord's default. A process that exits sooner is a failed start (BACKOFF, then FATAL
# after startretries): the counterpart of herder's --min-uptime. supervisord moves a process
# from STARTING to RUNNING on the first pass of its loop after startsecs, and that loop
# sleeps up to 1 s in poll(), so a worker is surely RUNNING only startsecs + 1 s after spawn.
SUPERVISORD_STARTSECS = 1
SUPERVISORD_LOOP = 1.0


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    kind: str  # "herder", "rq" (rq worker-pool) or "supervisord" (supervisord + rq worker)
    worker_class: str | None = None
    herder_flags: tuple[str, ...] = ()  # for herder: flags that make this variant

    @property
    def is_herder(self) -> bool:
        return self.kind == "herder"


HERDER = Contender("herder", "herder", "herder")
HERDER_NOFORK = Contender("herder-nofork", "herder --no-fork-server", "herder", None, ("--no-fork-server",))
RQ_DEFAULT = Contender("rq-default", "rq worker-pool (default class, rq.Worker: fork per job)", "rq")
RQ_SIMPLE = Contender("rq-simple", "rq worker-pool -w rq.worker.SimpleWorker", "rq", "rq.worker.SimpleWorker")
SUPERVISORD = Contender(
    "supervisord",
    "supervisord + rq worker -w rq.worker.SimpleWorker",
    "supervisord",
    "rq.worker.SimpleWorker",
)
ALL_CONTENDERS = [HERDER, HERDER_NOFORK, RQ_DEFAULT, RQ_SIMPLE, SUPERVISORD]
BY_KEY = {c.key: c for c in ALL_CONTENDERS}
PEERS = [RQ_DEFAULT, RQ_SIMPLE, SUPERVISORD]


def is_herder_master(cmdline: list[str]) -> bool:
    """Whether a command line is `python ... -m herder.supervisor[.<module>] ...`."""
    if "-m" not in cmdline[:-1]:
        return False
    module = cmdline[cmdline.index("-m") + 1]
    return module == HERDER_MASTER_PACKAGE or module.startswith(HERDER_MASTER_PACKAGE + ".")


def registered_pids(conn: Redis) -> set[int]:
    """The pids of the workers in RQ's worker registry (`rq.Worker.all()`)."""
    return {w.pid for w in Worker.all(connection=conn) if w.pid}


class ListingWatch:
    """When RQ lists a new worker, without polling: Redis's keyspace notifications of the set
    `rq.Worker.all()` reads (`rq:workers`; a worker enters it in the MULTI/EXEC that writes its
    hash). The bench reads the `sadd` message as it arrives, then which name is new."""

    def __init__(self, conn: Redis) -> None:
        self.conn = conn
        conn.config_set("notify-keyspace-events", "Ks")
        db = conn.connection_pool.connection_kwargs.get("db", 0)
        self.pubsub = conn.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(f"__keyspace@{db}__:{Worker.redis_workers_keys}")

    def drain(self) -> set[bytes]:
        """Forget what was said so far; the names listed now."""
        while self.pubsub.get_message(timeout=0):
            pass
        return set(self.conn.smembers(Worker.redis_workers_keys))

    def wait_new(self, before: set[bytes], t0: float, timeout: float) -> tuple[bytes, float] | None:
        """(the first name listed that is not in `before`, perf_counter seconds since t0)."""
        while time.perf_counter() - t0 < timeout:
            msg = self.pubsub.get_message(timeout=max(0.0, timeout - (time.perf_counter() - t0)))
            if msg is None or msg.get("data") != b"sadd":
                continue
            at = time.perf_counter() - t0
            fresh = set(self.conn.smembers(Worker.redis_workers_keys)) - before
            if fresh:
                return min(fresh), at
        return None

    def close(self) -> None:
        self.pubsub.close()


def first_job_taken(conn: Redis, key: bytes, t0: float, timeout: float, poll: float) -> float:
    """perf_counter seconds since t0 until the worker hash at `key` shows it took a job (busy,
    or a job counted), polled every `poll` s; NaN if not within `timeout`."""
    while time.perf_counter() - t0 < timeout:
        state, ok, failed = conn.hmget(key, "state", "successful_job_count", "failed_job_count")
        if state == b"busy" or int(ok or 0) or int(failed or 0):
            return time.perf_counter() - t0
        time.sleep(poll)
    return float("nan")


@dataclass
class Pool:
    contender: Contender
    popen: subprocess.Popen[bytes]
    log_path: Path
    launched_at: float  # time.time() just before the launch
    launched_mono: float  # time.monotonic() at the same moment
    size: int  # workers asked for
    state_dir: Path | None = None  # herder's, for `herder scale`
    _master: psutil.Process | None = field(default=None, repr=False)

    def master(self) -> psutil.Process | None:
        """The process whose children are the workers: herder's master, rq's pool process,
        supervisord."""
        if self._master is not None and self._master.is_running():
            return self._master
        try:
            top = psutil.Process(self.popen.pid)
            if not self.contender.is_herder:
                self._master = top
                return top
            # herder: `herder run` execs into the watchdog, whose child is the master (its
            # other child, if any, is an embedded redis-server).
            for child in top.children():
                with contextlib.suppress(psutil.Error):
                    if is_herder_master(child.cmdline()):
                        self._master = child
                        return child
        except psutil.NoSuchProcess:
            pass
        return None

    def workers(self, conn: Redis) -> dict[int, psutil.Process]:
        """The live children of the master that are registered in RQ: the workers. (herder's
        master has two more children, its fork server's template and its scheduler; rq's
        scheduler runs under one of the workers.)"""
        master = self.master()
        if master is None:
            return {}
        found = {}
        with contextlib.suppress(psutil.Error):
            kids = master.children()
            registered = registered_pids(conn)
            for p in kids:
                with contextlib.suppress(psutil.Error):
                    if p.pid in registered and p.status() != psutil.STATUS_ZOMBIE:
                        found[p.pid] = p
        return found

    def wait_ready(self, conn: Redis, timeout: float, interval: float = 0.02) -> dict[int, psutil.Process]:
        """Until all `size` workers are live children of the master and registered in RQ."""

        def full() -> dict[int, psutil.Process] | None:
            if self.popen.poll() is not None:
                raise BenchError(f"exited ({self.popen.returncode}) while starting; see {self.log_path}")
            kids = self.workers(conn)
            return kids if len(kids) >= self.size else None

        return wait_for(f"{self.size} registered workers", full, timeout=timeout, interval=interval)

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds used so far by (the supervising processes, the workers): herder's
        watchdog and master vs its workers (with its template and scheduler); rq's pool
        process or supervisord vs its workers, their work horses and rq's scheduler."""
        master = self.master() if self.contender.is_herder else None
        return cpu_by_role(self.popen.pid, {self.popen.pid} | ({master.pid} if master else set()))


@dataclass
class StopInfo:
    graceful: bool
    seconds: float
    leftovers: int  # processes still alive after the pool's top process exited, killed by us


def herder_has_flag(bindir: Path, env: dict[str, str], flag: str) -> bool:
    """Whether `herder run --help` mentions `flag`."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [str(bindir / "herder"), "run", "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return flag in out.stdout
    return False


class Launcher:
    """Starts and stops the pools, every contender with the same workers, queue and job."""

    def __init__(
        self,
        args: argparse.Namespace,
        tmp: Path,
        procs: Processes,
        server: RedisServer,
        herder_src: Path | None,
        findings: Findings,
    ) -> None:
        self.args = args
        self.tmp = tmp
        self.procs = procs
        self.server = server
        self.herder_src = herder_src  # a snapshot of herder's source to run from, if any
        self.findings = findings
        self.bindir = Path(args.bin_dir)
        self.jobdir = tmp / "jobs"
        self.jobdir.mkdir()
        (self.jobdir / f"{JOB_MODULE}.py").write_text(JOB_SOURCE)
        self.herder_args = shlex.split(args.herder_args or "")
        self.contenders = self.choose(args.contenders)

    def choose(self, wanted: str) -> list[Contender]:
        """The contenders asked for (--contenders) that can run here; a missing one is said."""
        keys = [k.strip() for k in wanted.split(",") if k.strip()]
        chosen = []
        for c in (BY_KEY[k] for k in keys):
            if c is HERDER_NOFORK and not herder_has_flag(self.bindir, self.herder_env(), "--no-fork-server"):
                self.findings.warnings.append(
                    f"`herder run --help` does not mention --no-fork-server: contender '{c.label}' left out"
                )
                continue
            if c.kind == "supervisord" and not os.access(self.bindir / "supervisord", os.X_OK):
                self.findings.problems.append(
                    f"no `supervisord` in {self.bindir} (pip install supervisor, or the bench extra): "
                    f"contender '{c.label}' left out"
                )
                continue
            chosen.append(c)
        return chosen

    def herder_env(self) -> dict[str, str]:
        env = child_env()
        if self.herder_src:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.herder_src), env.get("PYTHONPATH")]))
        return env

    def min_age(self, c: Contender) -> float:
        """The youngest worker the crash test may kill: past herder's --min-uptime (the
        default --min-age), and for supervisord surely RUNNING (startsecs + one loop pass)."""
        if c.kind == "supervisord":
            return max(self.args.min_age, SUPERVISORD_STARTSECS + SUPERVISORD_LOOP + 0.5)
        return self.args.min_age

    def argv(self, c: Contender, size: int, run_name: str) -> tuple[list[str], Path | None]:
        n = str(size)
        if c.is_herder:
            state = self.tmp / f"state-{run_name}"
            argv = [str(self.bindir / "herder"), "run", "--redis-url", self.server.url, "--workers", n]
            argv += ["--queue", QUEUE, "--path", str(self.jobdir), "--state-dir", str(state)]
            if size > 16:  # herder caps workers at min(16 x CPUs, memory / 64 MiB) unless told
                argv += ["--workers-limit", n]
            return [*argv, *c.herder_flags, *self.herder_args], state
        if c.kind == "supervisord":
            conf = self.supervisord_conf(c, size, run_name)
            return [str(self.bindir / "supervisord"), "-n", "-c", str(conf)], None
        argv = [str(self.bindir / "rq"), "worker-pool", "--url", self.server.url, "--num-workers", n]
        argv += ["--path", str(self.jobdir)]
        if c.worker_class:
            argv += ["--worker-class", c.worker_class]
        return [*argv, QUEUE], None

    def rq_worker_argv(self, c: Contender) -> list[str]:
        """One `rq worker` as supervisord runs it. --with-scheduler: rq worker-pool runs its
        workers with the scheduler on, and herder runs one, so every contender has one."""
        argv = [str(self.bindir / "rq"), "worker", "--url", self.server.url]
        argv += ["-w", c.worker_class or "rq.Worker", "--path", str(self.jobdir), "--with-scheduler"]
        return [*argv, QUEUE]

    def supervisord_conf(self, c: Contender, size: int, run_name: str) -> Path:
        """A supervisord.conf for this run: one [program] of `size` `rq worker` processes,
        their output appended to the run's log. No [unix_http_server]: nothing talks to it."""
        conf = self.tmp / f"supervisord-{run_name}.conf"
        log = self.tmp / f"{run_name}.log"
        command = shlex.join(self.rq_worker_argv(c)).replace("%", "%%")
        lines = [
            "; written by scripts/bench",
            "[supervisord]",
            "nodaemon=true",
            f"logfile={self.tmp / f'supervisord-{run_name}.log'}",
            f"pidfile={self.tmp / f'supervisord-{run_name}.pid'}",
            f"childlogdir={self.tmp}",
            *(["user=root"] if os.geteuid() == 0 else []),  # as root, it warns unless told so
            "",
            "[program:rqworker]",
            f"command={command}",
            f"numprocs={size}",
            "process_name=%(program_name)s_%(process_num)02d",
            "autostart=true",
            "autorestart=true",
            f"startsecs={SUPERVISORD_STARTSECS}",
            "stopsignal=TERM",
            f"stopwaitsecs={self.args.stop_timeout:g}",
            "redirect_stderr=true",
            f"stdout_logfile={log}",
            "stdout_logfile_maxbytes=0",
            "stdout_logfile_backups=0",
        ]
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def launch(self, c: Contender, run_name: str, size: int | None = None) -> Pool:
        """Start `c`'s pool of `size` workers (default --workers), logging to <tmp>/<run_name>.log."""
        size = size or self.args.workers
        log_path = self.tmp / f"{run_name}.log"
        argv, state_dir = self.argv(c, size, run_name)
        with open(log_path, "ab") as f:
            f.write(f"$ {shlex.join(argv)}\n".encode())
        env = self.herder_env() if c.is_herder else child_env()
        launched_at, launched_mono = time.time(), time.monotonic()
        popen = self.procs.start(argv, log_path, env)
        return Pool(c, popen, log_path, launched_at, launched_mono, size, state_dir)

    def herder_cli(self, pool: Pool, *argv: str) -> subprocess.CompletedProcess[str]:
        """`herder <argv> --state-dir <pool's>`, e.g. `herder scale 3`."""
        cmd = [str(self.bindir / "herder"), *argv, "--state-dir", str(pool.state_dir)]
        return subprocess.run(
            cmd, env=self.herder_env(), capture_output=True, text=True, timeout=60, check=False
        )

    def command(self, c: Contender) -> str:
        """The command line of `c`, for the report (temp paths shortened)."""
        argv, _ = self.argv(c, self.args.workers, "RUN")
        if c.kind == "supervisord":
            argv = [*argv, ";", "program:", *self.rq_worker_argv(c)]
        text = shlex.join(argv).replace(self.server.url, "URL").replace(str(self.tmp), "TMP")
        return text.replace(str(self.bindir) + "/", "")

    def stop(self, pool: Pool) -> StopInfo:
        """SIGTERM (a graceful stop for all of them), wait, then kill whatever is left."""
        t0 = time.monotonic()
        graceful = True
        family: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(pool.popen.pid)
            family = [top, *top.children(recursive=True)]  # in case an orphan escapes us
        if pool.popen.poll() is None:
            pool.popen.send_signal(signal.SIGTERM)
            try:
                pool.popen.wait(timeout=self.args.stop_timeout + 5)
            except subprocess.TimeoutExpired:
                graceful = False
                self.findings.problems.append(
                    f"{pool.contender.label}: still running {self.args.stop_timeout + 5:g} s after SIGTERM; "
                    f"killed (log: {pool.log_path})"
                )
        seconds = time.monotonic() - t0
        leftovers = self.procs.kill_all(spare={self.server.pid}, extra=family)
        if leftovers and graceful:
            self.findings.problems.append(
                f"{pool.contender.label}: {leftovers} process(es) still alive after it exited on SIGTERM; "
                f"killed (log: {pool.log_path})"
            )
        return StopInfo(graceful, seconds, leftovers)


@dataclass
class Scenario:
    """What a scenario runs with: the options, the private Redis, the launcher of the pools,
    noise control, and the findings it adds to."""

    args: argparse.Namespace
    redis: Redis
    launcher: Launcher
    noise: Noise
    findings: Findings
