"""What wakes the reconcile loop: a self-pipe that reader threads, the load reader, the
control thread and signal handlers write to, and the signals themselves, turned into what
they ask of the master. Handlers only record; the loop acts (gunicorn's arbiter).
"""

from __future__ import annotations

import logging
import os
import select
import signal
from dataclasses import dataclass

from herder.supervisor.children.launcher import Clock

log = logging.getLogger("herder")

DUPLICATE_SIGNAL_WINDOW = 1.0  # a second SIGINT sooner than this is a duplicate delivery
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD)


@dataclass(frozen=True)
class Request:
    action: str  # "stop" or "reload"
    why: str  # the signal's name, for the log
    hurry: bool = False  # stop now: jobs still running go back on their queues


class Events:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._signals: list[int] = []
        self._sigints = 0
        self._first_sigint = 0.0
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def wake(self) -> None:
        """Something worth a look happened (called from any thread)."""
        try:
            os.write(self._w, b".")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake anyway

    def record(self, signum: int, _frame: object = None) -> None:
        self._signals.append(signum)  # set_wakeup_fd wakes the loop

    def install_signals(self) -> None:
        for sig in HANDLED:
            signal.signal(sig, self.record)
        signal.set_wakeup_fd(self._w)

    def wait(self, timeout: float) -> None:
        try:
            readable, _, _ = select.select([self._r], [], [], timeout)
        except InterruptedError:
            return
        if readable:
            try:
                while os.read(self._r, 4096):
                    pass
            except BlockingIOError:
                pass

    def requests(self) -> list[Request]:
        """What the signals received since the last call ask for, in order."""
        out = []
        while self._signals:
            sig = self._signals.pop(0)
            if sig == signal.SIGHUP:
                out.append(Request("reload", "SIGHUP"))
            elif sig == signal.SIGQUIT:
                out.append(Request("stop", "SIGQUIT", hurry=True))
            elif sig == signal.SIGTERM:
                out.append(Request("stop", "SIGTERM"))
            elif sig == signal.SIGINT:
                now = self.clock.monotonic()
                if self._sigints and now - self._first_sigint < DUPLICATE_SIGNAL_WINDOW:
                    # One Ctrl-C delivered twice (to the process and to its group, as
                    # `timeout` and some shells do) is not a request to hurry.
                    log.info("SIGINT again within %g s: taken as the same one", DUPLICATE_SIGNAL_WINDOW)
                    continue
                self._sigints += 1
                self._first_sigint = self._first_sigint or now
                hurry = self._sigints > 1
                out.append(Request("stop", "second SIGINT" if hurry else "SIGINT", hurry=hurry))
            # SIGCHLD only wakes the loop: reap() looks at every worker each pass
        return out
