"""Event hooks: a push when something a person should hear of happens (supervisord's event
listeners, Sidekiq's death handlers, RQ's webhooks), instead of waiting for a scrape.

`--on-event COMMAND` runs COMMAND (split as a shell would, run without one) with the event
as one JSON object on its stdin; `--on-event-url URL` POSTs the same JSON. Events: a worker
that died unasked (crashed, killed from outside), a worker killed or culled, a budget spent,
a job given up, the master restarted, health changing.

Never in the loop's way: `emit` only puts the event on a bounded queue (a full queue drops
and counts it); HOOK_THREADS threads deliver, each hook bounded by `on_event_timeout` (a
hook still running then is killed with its process group, and counted). A hook that cannot
start is logged once, then counted. Its stdout is discarded and only the tail of its stderr
is kept, so a flooding hook costs the master nothing but the read. The hook's environment
has no HERDER_* variable (the resolved config there holds the Redis URL and its password),
and no event carries a secret: each field is chosen here, never copied from the config.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import selectors
import shlex
import signal
import socket
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from herder.common.config import Config

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger("herder")

QUEUED = 256  # events waiting for delivery; more are dropped (and counted)
HOOK_THREADS = 2  # hooks running at once
STDERR_TAIL = 2048  # bytes of a hook's stderr kept for the log
OUTCOMES = ("ok", "failed", "timeout", "unstartable", "dropped")
EVENTS = (
    "worker_died",
    "worker_killed",
    "worker_culled",
    "budget_spent",
    "job_given_up",
    "master_restarted",
    "health_changed",
)


class EventHooks:
    """`counted`: keep herder_event_hooks for /metrics (only a master with --http serves it,
    and only that one imports prometheus-client)."""

    def __init__(self, cfg: Config, host_id: str, counted: bool = False) -> None:
        self.host_id, self.hostname = host_id, socket.gethostname()
        self.command: list[str] = []
        self.url = ""
        self.timeout = 10.0
        self.counts: Counter | None = None
        if counted:
            from prometheus_client import Counter

            self.counts = Counter(
                "herder_event_hooks",
                "Event hook deliveries, by outcome (ok, failed, timeout, unstartable, dropped).",
                labelnames=["outcome"],
                registry=None,  # the HTTP endpoint registers it beside the fleet's metrics
            )
            for outcome in OUTCOMES:
                self.counts.labels(outcome)
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUED)
        self._threads: list[threading.Thread] = []
        self._said: set[str] = set()  # problems already logged once
        self.configure(cfg)

    @property
    def enabled(self) -> bool:
        return bool(self.command or self.url)

    def configure(self, cfg: Config) -> None:
        """The hooks in force (at start, and on reload)."""
        self.command = shlex.split(cfg.on_event) if cfg.on_event else []
        self.url, self.timeout = cfg.on_event_url, cfg.on_event_timeout
        if self.enabled and not self._threads:
            for n in range(HOOK_THREADS):
                t = threading.Thread(target=self._deliver, name=f"event-hook-{n}", daemon=True)
                t.start()
                self._threads.append(t)

    def emit(self, event: str, **fields: Any) -> None:
        """Queue one event (any thread); never blocks."""
        if not self.enabled:
            return
        body = {"event": event, "ts": time.time(), "host_id": self.host_id, "hostname": self.hostname,
                "master_pid": os.getpid(), **fields}  # fmt: skip
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self._count("dropped")
            self._once("full", "event hooks: %d events wait already; dropping %s events until they drain",
                       QUEUED, event)  # fmt: skip

    def close(self) -> None:
        """Let queued events go out for a moment, then stop (the master is exiting)."""
        deadline = time.monotonic() + min(self.timeout, 5.0)
        while self._threads and not self._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break

    # ---- delivery (hook threads) ----------------------------------------------------------

    def _deliver(self) -> None:
        while (body := self._queue.get()) is not None:
            payload = json.dumps(body).encode() + b"\n"
            if self.command:
                self._count(self._run(list(self.command), payload, body["event"]))
            if self.url:
                self._count(self._post(self.url, payload, body["event"]))

    def _count(self, outcome: str) -> None:
        if self.counts is not None:
            self.counts.labels(outcome).inc()

    def _run(self, argv: list[str], payload: bytes, event: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
        env["HERDER_EVENT"] = event  # the one HERDER_ variable a hook gets: which event
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=env, start_new_session=True)  # fmt: skip
        except OSError as exc:
            self._once(f"start:{argv[0]}", "event hook %r cannot start: %s", argv[0], exc)
            return "unstartable"
        assert proc.stdin and proc.stderr
        try:
            proc.stdin.write(payload)  # small: fits the pipe even if the hook never reads it
            proc.stdin.close()
        except OSError:
            pass
        tail, timed_out = self._drain(proc.stderr, time.monotonic() + self.timeout)
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        code = proc.wait()
        proc.stderr.close()
        said = tail.decode("utf-8", "replace").strip()[-500:]
        if timed_out:
            log.warning("event hook for %s killed after %g s (its timeout)%s", event, self.timeout,
                        f": {said}" if said else "")  # fmt: skip
            return "timeout"
        if code != 0:
            log.warning("event hook for %s exited %d%s", event, code, f": {said}" if said else "")
            return "failed"
        return "ok"

    @staticmethod
    def _drain(pipe: Any, deadline: float) -> tuple[bytes, bool]:
        """Read the hook's stderr until EOF or the deadline, keeping only its tail."""
        tail = b""
        with selectors.DefaultSelector() as sel:
            sel.register(pipe, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not sel.select(left):
                    continue
                chunk = os.read(pipe.fileno(), 65536)
                if not chunk:
                    return tail, False
                tail = (tail + chunk)[-STDERR_TAIL:]
        return tail, True

    def _post(self, url: str, payload: bytes, event: str) -> str:
        import urllib.request  # only a master with --on-event-url posts (it imports http.client)

        request = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                reply.read(STDERR_TAIL)
            return "ok"
        except TimeoutError:
            log.warning("event webhook for %s: no answer within %g s", event, self.timeout)
            return "timeout"
        except Exception as exc:  # refused, an HTTP error, a bad URL: logged, counted, never fatal
            self._once(f"url:{type(exc).__name__}", "event webhook for %s failed: %s: %s (said once)", event,
                       type(exc).__name__, exc)  # fmt: skip
            return "failed"

    def _once(self, key: str, message: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log.error(message, *args)


class HealthChanges:
    """Which health events a new set of reasons makes: `health_changed` when the kinds differ
    (not while starting or stopping: those are herder's own doing), and `budget_spent` when
    a kill or cull budget is newly spent. Pure: unit-tested with plain lists."""

    QUIET = frozenset({"starting", "stopping"})

    def __init__(self) -> None:
        self.kinds: frozenset[str] | None = None

    def observe(self, reasons: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
        kinds = frozenset(kind for kind, _ in reasons) - self.QUIET
        before, self.kinds = self.kinds, kinds
        if before is None or kinds == before:
            return []
        text = [r for kind, r in reasons if kind not in self.QUIET]
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "health_changed",
                {"status": "degraded" if kinds else "ok", "reasons": text, "was": sorted(before)},
            )
        ]
        for kind, reason in reasons:
            if kind.endswith("_budget_spent") and kind not in before:
                events.append(
                    ("budget_spent", {"budget": kind.removesuffix("_budget_spent"), "reason": reason})
                )
        return events
