"""The fork server: python -P -m herder.worker.template, started by the master.

A warm template for workers, as rq's pool, gunicorn's --preload and multiprocessing's
forkserver have one: it imports herder's worker, rq and redis once (plus the user's
`--preload` modules), freezes what it imported out of the garbage collector's reach (so
children share those pages instead of copying them), and then forks a worker per request.
A worker so made is ready in milliseconds and its unique memory is what it touched since.

It stays single-threaded and opens no Redis connection: whatever a worker inherits at fork
is imports only. Requests come over a SOCK_SEQPACKET socket from the master (the fd in
HERDER_FORK_SOCKET): a JSON {"env", "argv"} plus three fds, the worker's stdin, stdout and
stderr, which the master made and keeps the other ends of. Reply: {"pid": N} or {"error"}.

Who reaps: the master is a child subreaper (Linux's PR_SET_CHILD_SUBREAPER), and the template
double-forks. The middle process exits at once, so the worker is handed to the master before
the template replies; from then on it is the master's child like a spawned one (waitpid,
exit status, process group, getppid() == the master). See docs/design.md, "Warm workers".

It exits when the master's end of the socket closes (the master is gone or replaced it).

The master's first template is not a new interpreter: the master forks it from itself before its
first thread starts (`main_forked`), after importing rq and redis, which it needs too, so the
template and every worker share those pages with the master. A later template (a rolling restart
brings new code, or the first one died) is started as `python -m herder.worker.template`.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

from herder.common import handover
from herder.common import worker_protocol as wp
from herder.common.prctl import set_process_name

ENV_FORK_SOCKET = "HERDER_FORK_SOCKET"
ENV_MASTER_PID = "HERDER_MASTER_PID"
MAX_REQUEST = 1 << 20  # the environment is the bulk of a request: a few KB
# Forked workers keep the template's command line; their process names (ps -o comm, top,
# psutil's name()) tell the two apart. Plain-spawned workers are named "python".
TEMPLATE_NAME = "herder-forksrv"
WORKER_NAME = "herder-worker"
SPARE_NAME = "herder-spare"  # a worker forked ahead, not asked for yet (Spare)
SCHEDULER_NAME = "herder-sched"
# What a request may ask for (its "kind"): the module whose main() the child runs, its name.
ENTRIES = {
    "worker": ("herder.worker.__main__", WORKER_NAME),
    "scheduler": ("herder.worker.scheduler", SCHEDULER_NAME),  # RQ's scheduler, one per host
}
SPARE_AFTER = 0.05  # seconds of no request before the template forks a spare


def set_title(name: str, master_pid: int) -> None:
    """This process's name (`ps -o comm`, top, psutil's name()) and command line (`ps -f`,
    `pkill -f`): a forked process keeps its parent's command line otherwise, and `pkill -f
    herder.supervisor` must not reach the template or a worker (setproctitle, as gunicorn's and
    celery's processes use it; without it only the name changes)."""
    try:
        from setproctitle import setproctitle

        setproctitle(f"{name} [herder master {master_pid}]")
    except ImportError:
        pass
    set_process_name(name)  # after setproctitle, which sets the name to its title's start


def preload(paths: list[str], modules: list[str], fast_path: bool = True) -> None:
    """What every worker would import anyway, and the user's --preload modules."""
    import herder.worker.__main__  # noqa: F401
    import herder.worker.scheduler  # noqa: F401  (the scheduler is forked from here too)
    from herder.worker.factory import fast_path_unavailable  # rq, redis, herder's worker classes

    fast = fast_path and fast_path_unavailable() is None  # checked (and said) once: workers inherit it
    if fast:
        from herder.worker.fast_path.worker import HerderFastWorker  # noqa: F401  (the default class)
    from herder.common.redis_connect import connect  # noqa: F401

    try:
        import setproctitle  # noqa: F401  (each forked process sets its title: set_title)
    except ImportError:
        pass
    # What the first connection and RQ's bookkeeping import lazily (seen with -X importtime).
    lazy = ("encodings.idna", "hmac", "secrets", "stringprep", "unicodedata", "rq.results", "rq.registry")
    for name in lazy:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    if fast:  # once here, not a walk of every module in each new worker; after rq's last import
        from herder.worker.fast_path import shortcuts

        shortcuts.install()
    if modules:
        for path in reversed(paths):
            sys.path.insert(0, os.path.abspath(path))
        for name in modules:
            importlib.import_module(name)


def close_inherited(keep: int = -1) -> None:
    """Close every fd above stdio the template had open (but `keep`): a worker holds only its
    own pipes and what it opens itself."""
    top = os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024
    if keep < 3:
        os.closerange(3, top)
    else:
        os.closerange(3, keep)
        os.closerange(keep + 1, top)


def become_worker(
    request: dict, fds: list[int], master_pid: int, middle_pid: int, closed_already: bool = False
) -> None:
    """In the grandchild: take the pipes, run the worker; never returns.

    It does not wait for its middle parent to exit (tearing down a copy of the template takes
    a few ms): the channel knows both pids (ENV_PARENT_PIDS) and takes neither for a lost master.
    `closed_already`: a spare closed what it inherited before it opened its connections; only
    the request's fds are left to close.
    """
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group, as a spawned worker's (the master signals it)
        entry, name = ENTRIES[request.get("kind") or "worker"]
        set_title(name, master_pid)
        if os.getppid() not in (middle_pid, master_pid):
            os._exit(70)  # the master died meanwhile: nobody would watch this worker
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        if closed_already:
            for fd in set(fds) - {0, 1, 2}:
                os.close(fd)
        else:
            close_inherited()
        default_signals()
        os.environ.clear()
        os.environ.update(handover.accept(request["env"]))  # its config in memory, not in its environment
        os.environ[wp.ENV_PARENT_PIDS] = f"{master_pid},{middle_pid}"
        sys.argv = list(request.get("argv") or ["herder-worker"])
        code = importlib.import_module(entry).main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def default_signals() -> None:
    """Python's own signal handling, whatever the parent set (the template, or the master)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def double_fork(run: Callable[[int], None]) -> int:
    """Double-fork; the grandchild's pid. It calls `run(middle_pid)` and never returns. The
    middle process exits at once (SIGCHLD is ignored here, so the kernel reaps it) and so hands
    the grandchild to the master, the subreaper."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            me = os.getpid()  # not the grandchild's getppid(): by then it may be the master
            pid = os.fork()
            if pid == 0:
                os.close(w)
                try:
                    run(me)
                finally:
                    os._exit(1)
            try:
                os.setpgid(pid, pid)  # as the worker does itself: whichever runs first, it exists
            except OSError:
                pass
            os.write(w, b"%d\n" % pid)
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while not data.endswith(b"\n") and (chunk := os.read(r, 32)):
        data += chunk
    os.close(r)
    if not data.endswith(b"\n"):
        raise OSError("the fork server's middle process died before it forked")
    return int(data)


def fork_worker(request: dict, fds: list[int], master_pid: int) -> int:
    """A worker double-forked for this request; its pid."""
    return double_fork(lambda middle: become_worker(request, fds, master_pid, middle))


class Spare:
    """A worker forked before it is asked for, waiting for its request on a socket of its own.

    A replacement then costs the master one hand-over instead of the template's double fork
    (most of the fork server's part of a dead worker's replacement, and more under load). The
    template makes one when it has been idle a moment (SPARE_AFTER), so a burst of requests, as
    at launch, is not slowed by it. Already the master's child, it waits in the template's
    process group under its own name; it exits when the template's end of its socket closes
    (the template exited or was killed), and the master reaps it as a stray.
    """

    def __init__(self, master_pid: int, keep_from_it: list[socket.socket]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

        def wait_for_request(middle_pid: int) -> None:
            for s in [ours, *keep_from_it]:
                s.close()
            close_inherited(keep=theirs.fileno())
            set_title(SPARE_NAME, master_pid)
            from herder.worker.__main__ import prepare_ahead

            # Its connections to Redis, made and connected while nobody waits: a replacement
            # is listed sooner, for some memory while the pool idles (the trade, measured:
            # docs/benchmarks.md, "A replacement, step by step").
            prepare_ahead()
            try:
                msg, fds, _flags, _addr = socket.recv_fds(theirs, MAX_REQUEST, 3)
                theirs.close()
            except BaseException:
                os._exit(0)
            if not msg or len(fds) != 3:
                os._exit(0)  # the template is gone (or sent nonsense): nobody wants this worker
            become_worker(json.loads(msg), fds, master_pid, middle_pid, closed_already=True)

        try:
            self.pid = double_fork(wait_for_request)
        finally:
            theirs.close()
        self.sock = ours

    def hand_over(self, msg: bytes, fds: list[int]) -> int | None:
        """Give it a request; its pid, or None if it is gone (killed meanwhile)."""
        try:
            socket.send_fds(self.sock, [msg], fds)
        except OSError:
            return None
        finally:
            self.sock.close()
        return self.pid


def serve(sock: socket.socket, master_pid: int) -> int:
    sock.send(b"ready")
    spare: Spare | None = None
    while True:
        if spare is None and not select.select([sock], [], [], SPARE_AFTER)[0]:
            try:
                spare = Spare(master_pid, [sock])
            except OSError:
                pass  # no spare: the next request is forked on the spot
        msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, 3)
        if not msg:
            return 0  # the master closed its end (its spare, if any, sees its own close)
        try:
            if len(fds) != 3:
                raise ValueError(f"a request carries 3 fds, got {len(fds)}")
            request = json.loads(msg)
            pid = None
            if spare is not None and request.get("kind", "worker") == "worker":
                pid, spare = spare.hand_over(msg, fds), None
            reply = {"pid": pid or fork_worker(request, fds, master_pid)}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


def forget_the_master() -> None:
    """In a process forked from the master: drop what the master set up for itself (its log
    handler and hooks, its signal handlers), so the template and its workers set up their own."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.captureWarnings(False)
    sys.excepthook = sys.__excepthook__
    threading.excepthook = threading.__excepthook__
    faulthandler.unregister(signal.SIGUSR2)
    default_signals()


def main_forked(env: dict[str, str], fds: list[int], sock_fd: int) -> NoReturn:
    """In a child the master forked before its first thread: take the pipes (stdin, stdout,
    stderr) and the socket, forget the master, and serve as the template; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group, as a spawned template's
        set_title(TEMPLATE_NAME, int(env[ENV_MASTER_PID]))  # before the environment changes
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        close_inherited(keep=sock_fd)
        forget_the_master()
        os.environ.clear()
        os.environ.update(handover.accept(env))  # its config in memory, not in its environment
        sys.argv = [TEMPLATE_NAME]
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> int:
    sock = socket.socket(fileno=int(os.environ[ENV_FORK_SOCKET]))
    master_pid = int(os.environ.get(ENV_MASTER_PID) or os.getppid())
    set_title(TEMPLATE_NAME, master_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master stops it by closing the socket
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # middle processes are reaped by the kernel
    os.dup2(2, 1)  # a --preload module's prints go to the log, not to a pipe read as protocol
    from herder.common.config import Config

    cfg = Config.handed_over()
    preload(cfg.paths, cfg.preload, cfg.fast_path)
    from herder.worker.hooks import setup_django

    if cfg.django_settings:
        for path in reversed(cfg.paths):  # the project's apps are imported by django.setup()
            if os.path.abspath(path) not in sys.path:
                sys.path.insert(0, os.path.abspath(path))
    setup_django(cfg)  # once, before any fork: every worker starts with the apps loaded
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()  # imported objects move to a permanent generation: the gc never writes to them
    try:
        return serve(sock, master_pid)
    except (BrokenPipeError, ConnectionResetError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
