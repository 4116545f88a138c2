"""The end-to-end tests' library: what drives and inspects a real `herder run` and the processes
around it (conftest.py holds only the fixtures and hooks built on it).

- Herder: one `herder run` process tree, started as a user would, with its status read from the
  control socket and its log parsed (EXIT_LINE, KILL_LINE, MASTER_SUMMARY).
- Process helpers: the test tag every started process carries (TAG_VAR, tagged), the fork
  server, spares and the scheduler told apart from workers, zombies reaped.
- redis-server started on a free loopback port (start_redis, redis_on), never the default one.
- JobsHelper and the scenarios several modules share (run_jobs_killing_one_holder).
- What several modules read: /metrics parsed (metrics, sample), an --on-event hook's record
  (hook_command, read_events), `herder run` to its end (run_herder), the image's Dockerfile
  (instruction, image_uid). Test modules import each other's helpers never: they live here
  (the fakes of the unit tests in fakes.py).

Tests wait for the state a user would see: the status from the control socket (Herder.snapshot,
wait_status, wait_workers), Redis, the process table. A fixed sleep only measures an absence
over a span of time, and says so; a log line is checked as output in its own right, after the
state change that writes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

TESTS = Path(__file__).resolve().parent
JOBS_DIR = TESTS / "jobs"
FAKE_WORKERS = TESTS / "fakeworkers"
HERDER = str(Path(sys.executable).with_name("herder"))
TAG_VAR = "HERDER_TEST_TAG"
SCHEDULER_MODULE = "herder.worker.scheduler"  # the master's children that are not workers
TEMPLATE_NAME = "herder-forksrv"  # herder.worker.template's TEMPLATE_NAME
SPARE_NAME = "herder-spare"  # and its SPARE_NAME
SCHEDULER_NAME = "herder-sched"  # and the name of the scheduler it forks
GRACEFUL_STOP = signal.SIGTERM
READY_STATES = ("idle", "busy")  # a worker's state in the status once it has said `ready`
# The master's last words: its counters, the only record of them once herder has exited.
MASTER_SUMMARY = re.compile(
    r"master (?P<pid>\d+) stopped: spawned (?P<spawned>\d+), exited (?P<exited>\d+), "
    r"killed (?P<killed>\d+), jobs ok (?P<jobs_ok>\d+) failed (?P<jobs_failed>\d+), "
    r"requeued (?P<requeued>\d+), failed by herder (?P<failed_by_herder>\d+)"
)
# A worker's end, logged once as it is reaped (herder.supervisor.children.reaper.Reaper.reap_one):
#   slot 0 pid 123: busy -> exited (killed by SIGKILL; <kill reason>; lived 3.2 s, 5 jobs ok, 0 failed)
#   slot 0 pid 123: stopping -> exited (exit code 0; stopped as asked; lived 10.0 s, 5 jobs ok, 0 failed)
EXIT_LINE = re.compile(
    r"slot (?P<slot>\d+) pid (?P<pid>\d+): (?P<was>\w+) -> exited \((?P<how>[^;]+); (?P<why>.*?); "
    r"lived (?P<lived>[\d.]+) s, (?P<jobs_ok>\d+) jobs ok, (?P<jobs_failed>\d+) failed\)$",
    re.M,
)
# A kill, logged once: slot 0 pid 123: busy -> killing (SIGTERM to its process group: <reason>)
KILL_LINE = re.compile(
    r"slot (?P<slot>\d+) pid (?P<pid>\d+): (?P<was>\w+) -> killing \(SIGTERM to its process group: "
    r"(?P<why>.*)\)$",
    re.M,
)

# The flags every Herder runs with (before its test's own): short timeouts keep the suite fast.
SHORT_TIMEOUT_FLAGS = {
    "--heartbeat-interval": "1",
    "--heartbeat-timeout": "3",
    "--kill-timeout": "1",
    "--stop-timeout": "15",
    "--start-timeout": "20",
    "--job-timeout-grace": "1",
    "--min-uptime": "0.5",
    "--master-heartbeat-timeout": "5",
}


def become_subreaper() -> None:
    """Make this process a child subreaper (Linux), so workers orphaned by a killed master come
    back to it and are reaped here: a zombie left behind is then a finding, not noise."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def is_template(p: psutil.Process) -> bool:
    """The fork server (herder.worker.template); the workers it forks share its command line
    but not its process name."""
    try:
        return p.name() == TEMPLATE_NAME
    except psutil.NoSuchProcess:
        return False


def plain_spawns() -> bool:
    """This run spawns every worker as a new interpreter (.ci/run's second pass sets
    HERDER_FORK_SERVER=false): no fork server, no spare, the scheduler an interpreter too."""
    return os.environ.get("HERDER_FORK_SERVER", "").lower() in ("0", "false", "no")


def is_spare(p: psutil.Process) -> bool:
    """A worker the fork server forked ahead, not asked for yet: not a worker until it is."""
    try:
        return p.name() == SPARE_NAME
    except psutil.NoSuchProcess:
        return False


def ready_pids(status: dict[str, Any]) -> list[int]:
    """The pids of the workers a status shows ready (idle or busy)."""
    return [w["pid"] for w in status["workers"] if w["state"] in READY_STATES]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    predicate: Callable[[], object], timeout: float, interval: float = 0.05, what: str = ""
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def reap_adopted() -> None:
    """Reap zombies that were re-parented to us (orphaned workers), and only those."""
    for child in psutil.Process().children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass


def clean_env(**extra: str) -> dict[str, str]:
    """No pip configuration and no Python paths from the caller: installs come from the wheel
    cache alone, and nothing outside the venv in use is importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **extra)
    return env


def run_clean(
    *argv: str | Path, cwd: Path, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """A command of an install, in `clean_env`, that must succeed (never run from the checkout:
    `python -c` there would import its supervisor/ and watchdog/)."""
    r = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=clean_env(**env), cwd=cwd, timeout=timeout
    )
    assert r.returncode == 0, f"{' '.join(map(str, argv))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def living(p: psutil.Process) -> bool:
    """Whether a process still runs (not a zombie). It may exit, and be reaped, between any two
    looks at it: a vanished process is simply not living."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def tagged(tag: str, session: int | None = None) -> list[psutil.Process]:
    """The live processes of one herder: those whose environment carries its tag, and those in
    its session (`herder run` starts one). A process that sets its title (setproctitle) blanks
    what /proc shows of its environment, so the tag alone misses forked workers."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            mine = session is not None and os.getsid(p.pid) == session
            if (mine or p.environ().get(TAG_VAR) == tag) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
            pass
    return found


def zombies_of(tag_pids: set[int]) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.info["pid"] in tag_pids and p.info["status"] == psutil.STATUS_ZOMBIE:
            out.append(p.info["pid"])
    return out


# ---- Redis ----------------------------------------------------------------------------


def start_redis(workdir: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    """A private redis-server on a free loopback port; waits until it answers."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not on PATH; scripts/test installs it (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
    )
    password = extra[extra.index("--requirepass") + 1] if "--requirepass" in extra else None
    wait_until_redis_answers(Redis(port=port, password=password))
    return proc, port


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A loopback port whose accept queue is full and never drained: a connect to it gets no
    SYN-ACK, no refusal, nothing (as to a host that drops packets) until the client gives up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(16):
        s = socket.socket()
        s.settimeout(0.3)
        try:
            s.connect(("127.0.0.1", port))
        except TimeoutError:
            s.close()
            break
        fillers.append(s)
    else:
        pytest.fail("the accept queue never filled: connects are answered")
    try:
        yield port
    finally:
        for s in [*fillers, listener]:
            s.close()


class RoundTrips:
    """Counts the requests a client sends to Redis, each one round trip: a command, or a
    pipeline of them (each takes a connection from the client's pool once)."""

    def __init__(self, client: Redis) -> None:
        self.count = 0
        pool = client.connection_pool
        take = pool.get_connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return take(*args, **kwargs)

        pool.get_connection = counted  # type: ignore[method-assign]


def wait_until_redis_answers(client: Redis, timeout: float = 10) -> None:
    def up() -> bool:
        try:
            return bool(client.ping())
        except Exception:
            return False

    wait_for(up, timeout, what="redis-server to answer")


def redis_on(port: int, workdir: Path, *extra: str):  # noqa: ANN201
    """A redis-server on a given port (to restart one where its clients expect it)."""
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--dir", str(workdir), "--save", "", *extra],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_until_redis_answers(Redis(port=port))
    return proc


# ---- herder ---------------------------------------------------------------------------


class Herder:
    """One `herder run` process tree, started the way a user or a unit would."""

    def __init__(
        self,
        redis_url: str,
        workdir: Path,
        tag: str,
        args: dict[str, str | list[str] | bool | None],
        env: dict[str, str] | None = None,
        executable: str = HERDER,
    ):
        self.redis_url = redis_url
        self.workdir = workdir
        self.tag = tag
        self.log_path = workdir / "herder.log"
        opts = dict(SHORT_TIMEOUT_FLAGS)
        opts.update(
            {"--redis-url": redis_url, "--state-dir": str(workdir / "state"), "--path": str(JOBS_DIR)}
        )
        opts.update(args)
        self.argv = [executable, "run"]
        for key, value in opts.items():
            if value is None:
                continue
            if value is True:  # a bare flag: herder(no_scheduler=True) -> --no-scheduler
                self.argv.append(key)
                continue
            for v in value if isinstance(value, list) else [value]:
                self.argv += [key, v]
        self.proc: subprocess.Popen[bytes] | None = None
        self.seen_pids: set[int] = set()
        self.extra_env = env or {}
        self.state_dir = str(opts["--state-dir"])

    def start(self) -> Herder:
        env = dict(os.environ, **self.extra_env, **{TAG_VAR: self.tag})
        env.pop("HERDER_RESOLVED_CONFIG", None)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in cleanup()
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        return self

    def processes(self) -> list[psutil.Process]:
        """Every live process of this herder, orphans and forked workers included."""
        return tagged(self.tag, self.proc.pid if self.proc else None)

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 20, count: int = 1) -> list[re.Match[str]]:
        rx = re.compile(pattern)

        def found() -> list[re.Match[str]] | None:
            matches = list(rx.finditer(self.log()))
            return matches if len(matches) >= count else None

        return wait_for(found, timeout, what=f"{count}x /{pattern}/ in the herder log")  # type: ignore[return-value]

    def exits(self, pid: int | None = None) -> list[dict[str, str]]:
        """Every worker exit the log records (EXIT_LINE's fields), oldest first; or only pid's."""
        found = [m.groupdict() for m in EXIT_LINE.finditer(self.log())]
        return [e for e in found if pid is None or int(e["pid"]) == pid]

    def graceful_exits(self) -> list[dict[str, str]]:
        """The exits of workers that stopped as asked (exit code 0 after `stop`)."""
        return [e for e in self.exits() if e["how"] == "exit code 0" and e["why"] == "stopped as asked"]

    def kills(self) -> list[dict[str, str]]:
        """Every worker kill the log records (KILL_LINE's fields), oldest first."""
        return [m.groupdict() for m in KILL_LINE.finditer(self.log())]

    def master(self) -> psutil.Process | None:
        try:
            kids = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return None
        for k in kids:
            try:
                if k.cmdline()[-2:] == ["-m", "herder.supervisor"]:
                    return k
            except psutil.NoSuchProcess:
                pass
        return None

    def workers(self, master: psutil.Process | None = None) -> list[psutil.Process]:
        m = master or self.master()
        if m is None:
            return []
        out = []
        try:
            children = m.children()
        except psutil.NoSuchProcess:
            return []
        for k in children:
            try:  # one that exits meanwhile is skipped, not taken for the end of them all
                if k.status() == psutil.STATUS_ZOMBIE or self._is_scheduler(k):
                    continue
                if not is_template(k) and not is_spare(k):
                    out.append(k)
            except psutil.NoSuchProcess:
                pass
        self.seen_pids.update(p.pid for p in out)
        return out

    def fork_server(self) -> psutil.Process | None:
        """The master's fork server (herder.worker.template), which is not a worker."""
        m = self.master()
        try:  # the oldest of that name: a spare is born with it, and renames itself at once
            found = [k for k in (m.children() if m else []) if is_template(k)]
            return min(found, key=lambda k: k.create_time()) if found else None
        except psutil.NoSuchProcess:
            return None

    @staticmethod
    def _is_scheduler(p: psutil.Process) -> bool:
        try:
            # forked from the fork server under its own name, or a new interpreter of its own
            return p.name() == SCHEDULER_NAME or p.cmdline()[-1:] == [SCHEDULER_MODULE]
        except psutil.NoSuchProcess:  # gone (or a zombie) since it was listed
            return False

    def scheduler(self) -> psutil.Process | None:
        """The master's scheduler child (herder.worker.scheduler), which is not a worker."""
        m = self.master()
        try:
            for k in m.children() if m else []:
                if k.status() != psutil.STATUS_ZOMBIE and self._is_scheduler(k):
                    self.seen_pids.add(k.pid)
                    return k
        except psutil.NoSuchProcess:
            pass
        return None

    def snapshot(self) -> dict[str, Any]:
        """The status (the dict `herder status --json` prints) straight from the control
        socket, without starting a CLI process: for polling. Raises OSError while nobody
        answers, AssertionError if the master answers with an error."""
        from herder.supervisor.ctl import client

        reply = client.call(self.state_dir, {"cmd": "status"}, timeout=10)
        assert reply.get("ok"), f"the master refused `status`: {reply}"
        return reply

    def try_snapshot(self) -> dict[str, Any] | None:
        """snapshot(), or None while nobody answers the control socket."""
        try:
            return self.snapshot()
        except (OSError, ValueError):
            return None

    def wait_status(
        self,
        predicate: Callable[[dict[str, Any]], object],
        timeout: float = 20,
        what: str = "",
        interval: float = 0.1,
    ) -> dict[str, Any]:
        """Poll the status until `predicate(status)` holds; return that status. A predicate
        that looks up what a status does not carry yet (the master answers `starting`, with
        no totals or settings, while it loads) counts as not yet."""
        last: list[object] = [None]

        def check() -> dict[str, Any] | None:
            st = last[0] = self.try_snapshot()
            try:
                return st if st is not None and predicate(st) else None
            except (KeyError, IndexError, TypeError) as exc:
                last[0] = f"{exc!r} in {st}"
                return None

        try:
            return wait_for(check, timeout, interval, what=what or "a status that satisfies the test")  # type: ignore[return-value]
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last status: {str(last[0])[:3000]}") from None

    def wait_workers(
        self, n: int, timeout: float = 20, without: Collection[int] = ()
    ) -> list[psutil.Process]:
        """Wait until the status lists exactly n workers, every one ready (idle or busy), and
        they are exactly the master's live worker children; return them as processes (slot
        order). `without`: pids that must not be among them (the workers they replace)."""
        found: list[psutil.Process] = []
        gone = set(without)
        seen: list[object] = ["no status yet"]

        def ready() -> bool:
            st = self.try_snapshot()
            m = self.master()
            if st is None or m is None or st["master"]["pid"] != m.pid:
                return False
            listed = st["workers"]
            seen[0] = [(w["pid"], w["state"]) for w in listed]
            if len(listed) != n or any(w["state"] not in READY_STATES or w["pid"] in gone for w in listed):
                return False
            live = {p.pid: p for p in self.workers(m)}
            if set(live) != {w["pid"] for w in listed}:
                return False
            found[:] = [live[w["pid"]] for w in listed]
            return True

        others = f", none of {sorted(gone)}" if gone else ""
        try:
            wait_for(
                ready, timeout, interval=0.1, what=f"{n} ready workers (and no other{others}) in the status"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the status's workers last: {seen[0]}") from None
        return found

    def worker_for_job(self, conn: Redis, job_id: str, timeout: float = 10) -> int:
        """The pid of the worker running a job, from RQ's own record of it."""
        from rq.job import Job

        def pid() -> int | None:
            name = Job.fetch(job_id, connection=conn).worker_name
            return int(name.rsplit(".", 1)[1]) if name else None

        return wait_for(pid, timeout, what=f"a worker to take job {job_id}")  # type: ignore[return-value]

    def status(self) -> dict[str, Any]:
        """`herder status --json`, run as an operator would run it."""
        r = subprocess.run(
            [self.argv[0], "status", "--json", "--state-dir", self.state_dir],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode in (0, 3), f"herder status exited {r.returncode}: {r.stderr}"
        return json.loads(r.stdout)

    def totals(self) -> dict[str, int]:
        """The live master's counters: spawned, killed, requeued, failed_by_herder."""
        return self.snapshot()["totals"]

    def master_summaries(self) -> list[dict[str, int]]:
        """Every master's final counters (pid, spawned, exited, killed, jobs_ok, jobs_failed,
        requeued, failed_by_herder), oldest first, from the line each logs as it stops."""
        return [{k: int(v) for k, v in m.groupdict().items()} for m in MASTER_SUMMARY.finditer(self.log())]

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30) -> int:
        assert self.proc
        return self.proc.wait(timeout)

    def stop_and_check(
        self,
        sig: signal.Signals | None = GRACEFUL_STOP,
        timeout: float = 30,
        expect: int | None = 0,
        left_timeout: float = 10,
    ) -> float:
        """The usual end of a test: send `sig` to `herder run` (None: it is already on its
        way out), wait up to `timeout` s for it to exit with `expect` (None: any code), then
        check that none of its processes is left and none left a zombie.

        Returns the seconds from the signal to the exit.
        """
        assert self.proc
        self.workers()  # note the current workers, so a zombie among them is caught
        started = time.monotonic()
        if sig is not None:
            self.signal(sig)
        code = self.wait_exit(timeout)
        took = time.monotonic() - started
        if expect is not None:
            assert code == expect, f"herder run exited {code}, not {expect}; log ends:\n{self.log()[-3000:]}"
        self.assert_nothing_left(left_timeout)
        return took

    def cleanup(self) -> list[str]:
        """Kill whatever is left; return a description of leftovers (should be none)."""
        leftovers = []
        if self.proc and self.proc.poll() is None:
            leftovers.append(f"herder run {self.proc.pid}")
            self.proc.kill()
            self.proc.wait(10)
        for p in self.processes():
            try:
                leftovers.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
        try:  # SIGKILL is not instant: wait for them to be gone before reaping
            wait_for(lambda: not self.processes(), 5, what="the killed leftovers to exit")
        except AssertionError:
            leftovers.append("(some survived SIGKILL for 5 s)")
        reap_adopted()
        self._log.close()
        return leftovers

    def assert_nothing_left(self, timeout: float = 10) -> None:
        """No process of this herder left running, none left a zombie."""
        wait_for(lambda: not self.processes(), timeout, what="every herder process to exit")
        reap_adopted()
        assert not zombies_of(self.seen_pids), "zombie workers left behind"


# ---- what the fixtures and hooks keep on a test item ----------------------------------

HERDERS = pytest.StashKey[list[Herder]]()
REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()  # "setup", "call": that phase's report


# ---- jobs ----------------------------------------------------------------------------


class JobsHelper:
    def __init__(self, conn: Redis) -> None:
        from rq import Queue

        self.conn = conn
        self.queue = Queue("default", connection=conn)

    def enqueue(self, func: str, *args: object, **kw: object):
        return self.queue.enqueue(f"herder_testjobs.{func}", *args, **kw)

    def started(self, tag: str) -> list[str]:
        return [x.decode() for x in self.conn.lrange(f"started:{tag}", 0, -1)]

    def finished(self, tag: str) -> list[str]:
        return [x.decode() for x in self.conn.lrange(f"finished:{tag}", 0, -1)]

    def status(self, job_id: str) -> str:
        from rq.job import Job

        return Job.fetch(job_id, connection=self.conn).get_status().value

    def wait_finished(self, job_id: str, timeout: float, what: str) -> None:
        """Until RQ has the job finished. A test job records its run from inside the job, a few
        milliseconds before the worker marks it finished: waiting for the record alone races."""
        wait_for(lambda: self.status(job_id) == "finished", timeout, what=what)


def run_jobs_killing_one_holder(h: Herder, conn: Redis, tag: str) -> dict[str, Any]:
    """Through whatever Redis `conn` reaches: a job whose worker is killed mid-job comes back,
    and five more run; returns the status after. Every part of herder (the master's recovery,
    the workers, the scheduler) must reach that Redis for it to pass."""
    from rq import Queue

    q = Queue("default", connection=conn)
    held = q.enqueue("herder_testjobs.record", tag, 2)
    os.kill(h.worker_for_job(conn, held.id), signal.SIGKILL)  # the master requeues its job
    quick = [q.enqueue("herder_testjobs.record", tag).id for _ in range(5)]
    wait_for(
        lambda: (
            sorted(x.decode() for x in conn.lrange(f"finished:{tag}", 0, -1)) == sorted([held.id, *quick])
        ),
        20,
        what="every job to finish, the killed one requeued",
    )
    status = h.snapshot()
    assert status["totals"]["requeued"] == 1 and status["scheduler"]["holds"] == ["default"]
    return status


def http_status(url: str) -> int | None:
    """The HTTP status a GET of `url` answers with; None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def http_get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    """(status, body); (0, b"") when the server closed the connection unanswered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, http.client.HTTPException):
        return 0, b""


def metrics(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the /metrics served at `base`, parsed by prometheus-client's own text
    parser: (name, sorted labels) -> value."""
    code, body = http_get(base + "/metrics")
    assert code == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(m: dict, name: str, **labels: str) -> float | None:
    """One sample of `metrics`' answer, by its name and labels; None if it is not served."""
    return m.get((name, tuple(sorted(labels.items()))))


# ---- event hooks --------------------------------------------------------------------------

# The hook: appends the event (and what it saw of the environment) to a file, one JSON a line;
# for the event named in argv[2], it first writes its pid and hangs.
HOOK = """
import json, os, sys, time
event = json.loads(sys.stdin.read())
if len(sys.argv) > 2 and event["event"] == sys.argv[2]:
    open(sys.argv[1] + ".hung", "w").write(str(os.getpid()))
    time.sleep(600)
herder_env = sorted(k for k in os.environ if k.startswith("HERDER_"))
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({**event, "env": herder_env, "said": os.environ.get("HERDER_EVENT")}) + "\\n")
"""


def hook_command(tmp_path: Path, hang_on: str = "") -> tuple[str, Path]:
    """An --on-event command running HOOK, and the file it writes (read_events reads it)."""
    script, out = tmp_path / "hook.py", tmp_path / "events.jsonl"
    script.write_text(HOOK)
    return f"{sys.executable} {script} {out} {hang_on}".strip(), out


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---- the command line, the image -----------------------------------------------------------


def run_herder(
    *args: str, env: dict[str, str] | None = None, timeout: float = 20
) -> subprocess.CompletedProcess:
    """`herder run ARGS` to its end, in an environment without the caller's HERDER_* variables."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
    full_env.update(env or {})
    return subprocess.run(
        [HERDER, "run", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


DOCKERFILE = TESTS.parent / "deploy" / "container" / "Dockerfile"
SECRET_PLACEHOLDER = "redis://:secret-from-the-Secret@redis.invalid/0"  # never connected to


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments and directives dropped."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue  # also a comment inside a continued instruction, as Docker drops it
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        instruction, _, rest = (buf + s).partition(" ")
        out.append((instruction.upper(), rest.strip()))
        buf = ""
    return out


def instruction(name: str) -> list[str]:
    return [rest for instr, rest in dockerfile() if instr == name]


def image_uid() -> int:
    """The uid the image runs herder as (its USER)."""
    (user,) = instruction("USER")
    return int(user.split(":")[0])
