"""herder's configuration schema: one dataclass that the CLI, watchdog, master and worker
all read, its validation, its layering and its reload, in one place. Standard library only.

Where each setting comes from: defaults (the dataclass) < TOML file < HERDER_* environment
< flags. Every value goes through `coerce`, which knows its key and its source, so a wrong
type or an impossible value anywhere produces one message naming both, and exit 78
(EX_CONFIG). `herder run` resolves and validates, then hands the Config to the watchdog,
master and workers as JSON in the environment (ENV_RESOLVED): never on argv, where a Redis
password would be visible in the process list.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import shlex
import sys
import tomllib
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from herder.common.exits import EX_CONFIG

__all__ = [
    "EX_CONFIG",
    "Config",
    "ConfigError",
    "ReloadPlan",
    "reload_plan",
    "reread",
    "resolve",
    "load_file",
]

ENV_RESOLVED = "HERDER_RESOLVED_CONFIG"


class ConfigError(Exception):
    def __init__(self, key: str, message: str, source: str = "default") -> None:
        super().__init__(f"config key {key!r} from {source}: {message}")
        self.key = key
        self.source = source


class OverLimit(ConfigError):
    """A worker count above the host's workers limit: a configuration error (exit 78), never a
    usage error, so a service manager does not restart into it."""


# What `herder reload` does with a setting whose value the file changed (its `reload`):
APPLY = "apply"  # the master applies it in place (or reads it afresh where it is used)
WORKERS = "workers"  # only new workers pick it up: a rolling restart follows
RESTART = "restart"  # read once at start: a reload that changes it is refused, nothing changes


def setting(
    default: Any = None,
    help: str = "",  # noqa: A002
    factory: Any = None,
    reload: str = RESTART,
) -> Any:
    """A user setting: its default, the help its flag shows (`herder run --help`) and what a
    reload does with it (refused unless said otherwise: a reload never claims what it did not do)."""
    meta = {"help": help, "reload": reload}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def internal(default: Any = None, factory: Any = None) -> Any:
    """Bookkeeping `herder run` fills in itself: not a setting a user writes."""
    if factory is not None:
        return field(default_factory=factory, metadata={"internal": True})
    return field(default=default, metadata={"internal": True})


# Workers per CPU: a worker needs ~0.3 s of CPU to start (Python, redis, rq), so even a
# host starting all of them at once gives each core ~5 s of start-up work, well inside the
# start timeout; past that a bigger count only queues for the same cores.
WORKERS_PER_CPU = 16
# Memory per worker: an idle worker's RSS is ~35 MiB; 64 MiB leaves room for its job.
MEMORY_PER_WORKER = 64 * 2**20


def host_cpus() -> int:
    """The CPUs this process may run on (a cpuset or taskset narrows it), else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def host_memory() -> int | None:
    """Physical memory in bytes, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@functools.cache
def default_workers_limit() -> tuple[int, str]:
    """min(16 x CPUs, physical memory / 64 MiB), at least 1; and how it was reached."""
    cpus, memory = host_cpus(), host_memory()
    by_cpu = WORKERS_PER_CPU * cpus
    how = f"{WORKERS_PER_CPU} x {cpus} CPUs"
    if memory is None:
        return max(1, by_cpu), how
    by_memory = memory // MEMORY_PER_WORKER
    how = f"min({how}, {memory / 2**30:.1f} GiB / 64 MiB = {by_memory})"
    return max(1, min(by_cpu, by_memory)), how


def rq_settings_layer(module: str, paths: list[str]) -> dict[str, tuple[Any, str]]:
    """RQ's settings module (`rq worker -c`), read as `rq worker` reads it: REDIS_URL, or
    SENTINEL, or REDIS_HOST, REDIS_PORT, REDIS_DB, REDIS_PASSWORD and REDIS_SSL; and QUEUES."""
    source = f"rq settings module {module}"
    added = [os.path.abspath(p) for p in [*paths, "."] if os.path.abspath(p) not in sys.path]
    sys.path[:0] = added
    try:
        settings = vars(importlib.import_module(module))
    except Exception as exc:  # whatever the user's module raises, it is a config error
        raise ConfigError("rq_config", f"cannot import {module}: {exc.__class__.__name__}: {exc}") from None
    finally:
        del sys.path[: len(added)]
    out: dict[str, tuple[Any, str]] = {}
    url = settings.get("REDIS_URL")
    if url is None and settings.get("SENTINEL") is not None:
        url = sentinel_url(settings["SENTINEL"])
    if url is None and any(k in settings for k in ("REDIS_HOST", "REDIS_PORT", "REDIS_DB", "REDIS_PASSWORD")):
        ssl = str(settings.get("REDIS_SSL", False)).lower() in ("1", "y", "yes", "t", "true")
        password = settings.get("REDIS_PASSWORD")
        auth = f":{quote(str(password), safe='')}@" if password else ""
        host, port = settings.get("REDIS_HOST", "localhost"), settings.get("REDIS_PORT", 6379)
        url = f"{'rediss' if ssl else 'redis'}://{auth}{host}:{port}/{settings.get('REDIS_DB', 0)}"
    if url is not None:
        out["redis_url"] = (coerce("redis_url", url, source), source)
    if settings.get("QUEUES") is not None:
        out["queues"] = (coerce("queues", list(settings["QUEUES"]), source), source)
    return out


def sentinel_url(sentinel: dict[str, Any]) -> str:
    """RQ's SENTINEL setting as herder's redis+sentinel:// URL (herder.common.redis_connect)."""
    hosts = ",".join(f"{h}:{p}" for h, p in sentinel.get("INSTANCES", [("localhost", 26379)]))
    auth = ""
    if sentinel.get("PASSWORD"):
        user = quote(str(sentinel.get("USERNAME") or ""), safe="")
        auth = f"{user}:{quote(str(sentinel['PASSWORD']), safe='')}@"
    query = [("ssl", "true")] if sentinel.get("SSL") else []
    if (sentinel.get("SENTINEL_KWARGS") or {}).get("password"):
        query.append(("sentinel_password", quote(str(sentinel["SENTINEL_KWARGS"]["password"]), safe="")))
    tail = "?" + "&".join(f"{k}={v}" for k, v in query) if query else ""
    master, db = sentinel.get("MASTER_NAME", "mymaster"), sentinel.get("DB", 0)
    return f"redis+sentinel://{auth}{hosts}/{master}/{db}{tail}"


def is_dotted(name: str) -> bool:
    """package.module.Name (or json / pickle, RQ's serializer aliases)."""
    return all(part.isidentifier() for part in name.split("."))


def http_address(text: str) -> tuple[str, int]:
    """`--http` as (host, port): "9100" -> ("127.0.0.1", 9100); "0.0.0.0:9100"; "[::1]:9100".
    Loopback unless the user names another address."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.strip("[]") if host.startswith("[") else host
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"must be [ADDR:]PORT with a port from 1 to 65535, got {text!r}")
    if not host or (":" in host and not text.strip().startswith("[")):
        raise ValueError(f"must be [ADDR:]PORT (an IPv6 address in brackets: [::1]:9100), got {text!r}")
    return host, int(port)


@dataclass
class Config:
    """Every setting, its default and its help: the flags, HERDER_* variables and TOML keys
    of `herder run` are all made from these fields (flag --name-with-dashes, variable
    HERDER_NAME, key name; `queue` and `path` are the singular, repeatable forms)."""

    redis_url: str | None = setting(
        None, "Redis URL, e.g. redis://:password@host:6379/0 (default: embedded)."
    )
    queues: list[str] = setting(
        help="Queue to work on (repeatable), in priority order.",
        factory=lambda: ["default"],
        reload=WORKERS,
    )
    workers: int = setting(2, "Number of workers (fixed).", reload=APPLY)
    # Autoscaling: on when max_workers is set (then `workers` is ignored).
    min_workers: int | None = setting(
        None, "Autoscale: never fewer workers than this (default 1).", reload=APPLY
    )
    max_workers: int | None = setting(
        None, "Autoscale up to this many workers (turns autoscaling on).", reload=APPLY
    )
    # The hard ceiling on this host's worker processes (docs/operations.md, "Workers limit").
    workers_limit: int | None = setting(
        None,
        "The most worker processes this host runs, whatever is asked "
        f"(default min(16 x CPUs, memory / 64 MiB): {default_workers_limit()[0]} here).",
        reload=APPLY,
    )
    scale_interval: float = setting(
        1.0, "Seconds between load readings (one Redis round trip).", reload=APPLY
    )
    scale_down_delay: float = setting(
        30.0, "Seconds the need must stay low before workers stop.", reload=APPLY
    )
    drain_target: float = setting(
        30.0, "Size the fleet to empty the backlog within this many seconds.", reload=APPLY
    )
    # Several hosts on one Redis: a cap on the whole cluster's workers.
    host_id: str = setting("", "This host's name in a cluster (default hostname:pid).")
    # A new value applies; turning the cap on or off needs a restart (reload_plan).
    cluster_max_workers: int | None = setting(
        None, "Cap on the workers of all hosts on this Redis.", reload=APPLY
    )
    host_ttl: float = setting(10.0, "Seconds after which a silent host is forgotten.", reload=APPLY)
    # Deadline for a job whose busy line carries no timeout (RQ's own default is 180 s).
    job_timeout: float = setting(
        180.0, "Seconds a job may run when it does not set its own timeout.", reload=APPLY
    )
    # RQ's in-process alarm fires at the timeout; this is the backstop for code it cannot stop.
    job_timeout_grace: float = setting(
        10.0, "Seconds past its timeout before herder kills a job.", reload=APPLY
    )
    heartbeat_interval: float = setting(1.0, "Seconds between a worker's heartbeat lines.", reload=WORKERS)
    heartbeat_timeout: float = setting(10.0, "Seconds of worker silence before it is killed.", reload=APPLY)
    start_timeout: float = setting(30.0, "Seconds a new worker has to say `ready`.", reload=APPLY)
    # Both only downwards: the watchdog's stop grace was set from them at start (reload_plan).
    stop_timeout: float = setting(30.0, "Seconds a stopping worker has to finish its job.", reload=APPLY)
    kill_timeout: float = setting(5.0, "Seconds from SIGTERM to SIGKILL.", reload=APPLY)
    max_requeues: int = setting(3, "Times a dead worker's job is requeued before it is failed.", reload=APPLY)
    # How often a master looks for jobs no live worker holds (docs/design.md, "Jobs are never lost").
    sweep_interval: float = setting(
        2.0, "Seconds between sweeps for jobs whose worker is gone.", reload=APPLY
    )
    # A widespread fault must not take every worker (cluster-wide too with a cluster cap).
    kill_budget: float = setting(
        0.5, "Share of the fleet that may be killed as hung per budget window.", reload=APPLY
    )
    kill_budget_window: float = setting(60.0, "Seconds of the kill budget's sliding window.", reload=APPLY)
    min_uptime: float = setting(
        1.0, "A worker exiting sooner than this died young: its slot backs off.", reload=APPLY
    )
    backoff_initial: float = setting(
        0.1, "Seconds a slot waits after its first young death (then doubling).", reload=APPLY
    )
    backoff_max: float = setting(30.0, "The longest a slot's backoff grows.", reload=APPLY)
    # Watchdog: master silence deadline and restart intensity.
    master_heartbeat_timeout: float = setting(15.0, "Master silence before a restart.")
    max_restarts: int = setting(5, "Master restarts within --restart-window before giving up.")
    restart_window: float = setting(60.0, "Seconds.")
    paths: list[str] = setting(
        help="Directory to import job modules from (repeatable).", factory=list, reload=WORKERS
    )
    worker_command: list[str] | None = setting(
        None, "Run this program as the worker (it must speak the protocol).", reload=WORKERS
    )
    state_dir: str = setting(
        "",
        "Directory for herder's state, 0700 (default /run/herder as root, else $XDG_RUNTIME_DIR/herder-UID).",
    )
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR.", reload=WORKERS)
    user: str = setting("", "Started as root: run the master, workers and embedded Redis as this user.")
    # Self-defense: cull a worker whose jobs keep failing (within a shared budget), and recycle
    # workers by jobs, age and memory, a replacement first (docs/design.md, "Self-defense").
    cull_failures: int = setting(
        5, "Failed jobs within --cull-failure-window that get a worker culled (0: never).", reload=APPLY
    )
    cull_failure_window: float = setting(
        60.0, "Seconds over which a worker's failed jobs are counted.", reload=APPLY
    )
    cull_budget: int = setting(
        10, "Culls allowed per --cull-window, for all hosts on this Redis.", reload=APPLY
    )
    cull_window: float = setting(600.0, "Seconds of the cull budget's sliding window.", reload=APPLY)
    max_jobs: int | None = setting(None, "Recycle a worker after this many jobs.", reload=APPLY)
    max_jobs_jitter: int = setting(
        0, "Up to this many jobs more, at random per worker, so they recycle apart.", reload=APPLY
    )
    max_age: float | None = setting(None, "Recycle a worker after this many seconds.", reload=APPLY)
    max_age_jitter: float = setting(0.0, "Up to this many seconds more, at random per worker.", reload=APPLY)
    max_memory: float | None = setting(
        None, "Recycle a worker, between jobs, past this RSS in MB.", reload=APPLY
    )
    max_memory_hard: float | None = setting(
        None, "Kill a worker past this RSS in MB (default 1.5 x --max-memory).", reload=APPLY
    )
    recycle_share: float = setting(
        0.1, "At most this share of the fleet (at least 1) recycles at once.", reload=APPLY
    )
    # RQ's scheduler (enqueue_at/enqueue_in, Retry intervals): one child per host, RQ's locks
    # pick one per queue across hosts (docs/design.md, "RQ's scheduler").
    scheduler: bool = setting(
        True,
        "Run RQ's scheduler (off: it runs elsewhere, e.g. rq worker --with-scheduler).",
        reload=APPLY,
    )
    # Warm workers: forked from a template that imported herder, rq and redis (docs/design.md).
    fork_server: bool = setting(
        True, "Fork workers from a warm template (off: each worker is a new interpreter).", reload=WORKERS
    )
    preload: list[str] = setting(
        help="Module the template imports before forking workers (repeatable; fork-safe code only).",
        factory=list,
        reload=WORKERS,
    )
    # `rq worker`'s own options, for users coming from it (docs/migrating-from-rq.md).
    worker_class: str = setting(
        "", "RQ Worker class (dotted path) to combine with herder's protocol (rq worker -w).", reload=WORKERS
    )
    job_class: str = setting("", "RQ Job class, dotted path (rq worker -j).", reload=WORKERS)
    queue_class: str = setting("", "RQ Queue class, dotted path (rq worker --queue-class).", reload=WORKERS)
    serializer: str = setting(
        "", "json, pickle, or a serializer's dotted path (rq worker -S).", reload=WORKERS
    )
    exception_handlers: list[str] = setting(
        help="Exception handler, dotted path (repeatable; rq worker --exception-handler).",
        factory=list,
        reload=WORKERS,
    )
    disable_default_exception_handler: bool = setting(
        False, "Do not move failed jobs to the FailedJobRegistry (rq worker -d).", reload=WORKERS
    )
    results_ttl: int | None = setting(
        None, "Seconds results are kept (rq worker --results-ttl).", reload=WORKERS
    )
    worker_ttl: int | None = setting(
        None, "RQ's worker key TTL in seconds (rq worker --worker-ttl).", reload=WORKERS
    )
    maintenance_interval: int | None = setting(
        None, "Seconds between RQ's maintenance passes (rq worker --maintenance-interval).", reload=WORKERS
    )
    dequeue_strategy: str = setting(
        "default", "default, random or round_robin (rq worker --dequeue-strategy).", reload=WORKERS
    )
    rq_config: str = setting(
        "",
        "RQ's settings module (rq worker -c): REDIS_URL (or REDIS_HOST, _PORT, _DB, _PASSWORD, _SSL) "
        "and QUEUES, below the file, the environment and the flags.",
    )
    # Health and metrics for load balancers, probes and Prometheus (docs/operations.md).
    http: str = setting(
        "",
        "Serve /healthz and /metrics on [ADDR:]PORT (off by default; a bare PORT binds 127.0.0.1).",
    )
    health_grace: float = setting(
        10.0,
        "Seconds the fleet may be below its minimum of ready workers, or Redis unreachable, "
        "before health says degraded.",
        reload=APPLY,
    )
    config_file: str | None = internal()  # where the file layer came from, for reload
    embedded_redis: bool = internal(False)  # no redis_url given: the watchdog runs a private redis-server
    pinned: list[str] = internal(factory=list)  # keys set by environment or flags: reload keeps them
    defaulted: list[str] = internal(factory=list)  # keys `herder run` filled in itself (state_dir)

    def validate(self, sources: dict[str, str] | None = None) -> None:
        src = sources or {}

        def bad(key: str, message: str, kind: type[ConfigError] = ConfigError) -> ConfigError:
            return kind(key, message, src.get(key, "default"))

        if self.workers < 1:
            raise bad("workers", f"must be at least 1, got {self.workers}")
        if self.min_workers is not None and self.max_workers is None:
            raise bad("min_workers", "needs max_workers too (autoscaling is on when max_workers is set)")
        if self.workers_limit is not None and self.workers_limit < 1:
            raise bad("workers_limit", f"must be at least 1, got {self.workers_limit}")
        for key in ("max_workers", "min_workers") if self.autoscale else ("workers",):
            count = getattr(self, key)
            if count is not None and count > self.limit:
                raise bad(key, f"{count} is above {self.describe_limit()}", OverLimit)
        if self.max_workers is not None:
            if self.max_workers < 1:
                raise bad("max_workers", f"must be at least 1, got {self.max_workers}")
            if self.min_workers is not None and not 0 <= self.min_workers <= self.max_workers:
                raise bad(
                    "min_workers",
                    f"must be between 0 and max_workers ({self.max_workers}), got {self.min_workers}",
                )
        if self.cluster_max_workers is not None:
            if self.max_workers is None:
                raise bad("cluster_max_workers", "needs max_workers (autoscaling) too")
            if self.cluster_max_workers < 1:
                raise bad("cluster_max_workers", f"must be at least 1, got {self.cluster_max_workers}")
        if self.host_ttl <= self.scale_interval:
            raise bad("host_ttl", "must be longer than scale_interval")
        if not self.queues or any(not q or not q.isprintable() or " " in q for q in self.queues):
            raise bad("queues", "needs one or more queue names without spaces")
        positive = [
            "job_timeout",
            "heartbeat_interval",
            "heartbeat_timeout",
            "start_timeout",
            "kill_timeout",
            "backoff_initial",
            "backoff_max",
            "master_heartbeat_timeout",
            "restart_window",
            "scale_interval",
            "sweep_interval",
            "scale_down_delay",
            "drain_target",
            "kill_budget",
            "kill_budget_window",
            "cull_window",
            "cull_failure_window",
            "recycle_share",
            "health_grace",
        ]
        for key in positive:
            if not getattr(self, key) > 0:
                raise bad(key, f"must be greater than 0, got {getattr(self, key)}")
        for key in ("cull_failures", "cull_budget", "max_jobs_jitter", "max_age_jitter"):
            if getattr(self, key) < 0:
                raise bad(key, f"must not be negative, got {getattr(self, key)}")
        for key in ("max_jobs", "max_age", "max_memory", "max_memory_hard"):
            if getattr(self, key) is not None and not getattr(self, key) > 0:
                raise bad(key, f"must be greater than 0, got {getattr(self, key)}")
        if (
            self.max_memory_hard is not None
            and self.max_memory is not None
            and self.max_memory_hard <= self.max_memory
        ):
            raise bad("max_memory_hard", "must be above max_memory (the soft limit recycles between jobs)")
        for key in ("job_timeout_grace", "stop_timeout", "min_uptime"):
            if getattr(self, key) < 0:
                raise bad(key, f"must not be negative, got {getattr(self, key)}")
        # An idle RQ worker speaks once per dequeue slice of max(1 s, heartbeat_interval)
        # (worker/rq_worker.py); a timeout that does not outlast two slices kills healthy ones.
        slice_s = max(1.0, self.heartbeat_interval)
        if self.heartbeat_timeout < 2 * slice_s:
            raise bad(
                "heartbeat_timeout",
                f"must be at least twice max(1 s, heartbeat_interval), {2 * slice_s:g} s, got "
                f"{self.heartbeat_timeout:g}: an idle worker speaks only once per {slice_s:g} s dequeue "
                "slice, so a shorter timeout would kill healthy idle workers",
            )
        if self.max_requeues < 0:
            raise bad("max_requeues", "must not be negative")
        if self.max_restarts < 1:
            raise bad("max_restarts", "must be at least 1")
        if self.redis_url is not None:
            scheme = urlsplit(self.redis_url).scheme
            if scheme not in ("redis", "rediss", "unix", "redis+sentinel"):
                raise bad(
                    "redis_url",
                    f"scheme must be redis://, rediss://, unix:// or redis+sentinel://, got {scheme!r}",
                )
        if self.worker_command is not None and not self.worker_command:
            raise bad("worker_command", "is empty")
        if self.http:
            try:
                http_address(self.http)
            except ValueError as exc:
                raise bad("http", str(exc)) from None
        for key in ("worker_class", "job_class", "queue_class", "serializer", "rq_config"):
            if getattr(self, key) and not is_dotted(getattr(self, key)):
                raise bad(key, f"must be a dotted name like package.module.Name, got {getattr(self, key)!r}")
        for handler in self.exception_handlers:
            if not is_dotted(handler):
                raise bad(
                    "exception_handlers", f"must be dotted names like app.errors.report, got {handler!r}"
                )
        for module in self.preload:
            if not all(part.isidentifier() for part in module.split(".")):
                raise bad("preload", f"must be module names like app.jobs, got {module!r}")
        if self.dequeue_strategy not in ("default", "random", "round_robin"):
            raise bad(
                "dequeue_strategy", f"must be default, random or round_robin, got {self.dequeue_strategy!r}"
            )
        for key in ("results_ttl", "worker_ttl", "maintenance_interval"):
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise bad(key, f"must not be negative, got {getattr(self, key)}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise bad("log_level", f"must be DEBUG, INFO, WARNING or ERROR, got {self.log_level!r}")

    # ---- hand-over between processes ---------------------------------------------

    @property
    def autoscale(self) -> bool:
        return self.max_workers is not None

    @property
    def floor(self) -> int:
        """The fewest workers herder runs."""
        if self.max_workers is None:
            return self.workers
        return 1 if self.min_workers is None else self.min_workers

    @property
    def ceiling(self) -> int:
        """The most workers herder runs."""
        return self.workers if self.max_workers is None else self.max_workers

    @property
    def limit(self) -> int:
        """The most worker processes this host runs: workers_limit, else computed from the host."""
        return self.workers_limit if self.workers_limit is not None else default_workers_limit()[0]

    def describe_limit(self) -> str:
        """The limit and where it comes from, for the errors that name it."""
        if self.workers_limit is not None:
            return f"the workers limit of {self.limit} (workers_limit)"
        return (
            f"this host's workers limit of {self.limit} ({default_workers_limit()[1]}; "
            "raise it with workers_limit if the host can take more)"
        )

    @property
    def orphan_log(self) -> str | None:
        """Where a worker whose master died writes what its last job prints."""
        return os.path.join(self.state_dir, "orphaned-workers.log") if self.state_dir else None

    @property
    def lease_seconds(self) -> float:
        """How long a worker's lease outlives its last renewal. The worker renews it every
        heartbeat interval, its master every sweep: three missed renewals mean gone."""
        return max(5.0, 3 * max(self.sweep_interval, self.heartbeat_interval))

    @property
    def memory_hard_limit(self) -> float | None:
        """MB of RSS past which a worker is killed at once, job or not."""
        if self.max_memory_hard is not None:
            return self.max_memory_hard
        return None if self.max_memory is None else 1.5 * self.max_memory

    @property
    def drain_seconds(self) -> float:
        """The longest a graceful stop can take: every job's stop timeout, then the kill."""
        return self.stop_timeout + self.kill_timeout

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ: os._Environ[str] | dict[str, str] | None = None) -> Config:
        raw = (environ or os.environ).get(ENV_RESOLVED)
        if not raw:
            raise ConfigError(ENV_RESOLVED, "not set: start herder with `herder run`", "environment")
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def parse_worker_command(text: str) -> list[str]:
    """Split a --worker-command the way a shell would, without running a shell."""
    return shlex.split(text)


def redact_url(url: str | None) -> str:
    """A Redis URL fit for logs: any password (in the userinfo or ?password=) becomes ***.

    Edits the original text rather than re-assembling the URL, which would mangle forms
    like unix:///path.
    """
    if not url:
        return "(none)"
    url = _USERINFO_PASSWORD.sub(r"\1***\2", url)
    return _QUERY_PASSWORD.sub(r"\1***", url)


_USERINFO_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/@?#]*:)[^@/?#]*(@)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&][a-z_]*password=)[^&#]*", re.IGNORECASE)  # sentinel_password= too


# ---- layering: defaults < TOML file < HERDER_* environment < flags ----------------------

# Keys a user may write in a file or flag that map to another field name.
ALIASES = {"queue": "queues", "path": "paths", "exception_handler": "exception_handlers"}
SECRET_KEYS = {"redis_url"}
KEYS = [f.name for f in fields(Config) if not f.metadata.get("internal")]
_TYPES = {k: v for k, v in typing.get_type_hints(Config).items() if k in KEYS}
HELP = {f.name: f.metadata["help"] for f in fields(Config) if f.name in KEYS}


def flag_of(key: str) -> str:
    """The command-line flag of a setting: --queue for queues, --max-workers for max_workers."""
    singular = {field_name: alias for alias, field_name in ALIASES.items()}
    return "--" + singular.get(key, key).replace("_", "-")


def env_of(key: str) -> str:
    """The environment variable of a setting: HERDER_QUEUE, HERDER_MAX_WORKERS."""
    return "HERDER_" + flag_of(key)[2:].replace("-", "_").upper()


def repeatable(key: str) -> bool:
    return key in ALIASES.values()


def normalize_key(key: str) -> str:
    key = key.strip().replace("-", "_")
    return ALIASES.get(key, key)


def _describe(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def coerce(key: str, value: Any, source: str) -> Any:
    """Turn a raw value (a string from the environment or a flag, or a TOML value) into the
    type the Config field has; raise ConfigError naming the key and the source."""
    if key not in _TYPES:
        raise ConfigError(key, f"unknown setting; known ones: {', '.join(sorted(KEYS))}", source)
    tp = _TYPES[key]
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if optional else tp
    origin = typing.get_origin(base)
    if key == "worker_command":
        if isinstance(value, str):
            return parse_worker_command(value)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(key, "must be a command line string or a list of strings", source)
    if origin is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
            raise ConfigError(key, f"must be a list of strings, got {value!r}", source)
        out = [part for v in items for part in (v.split(",") if key == "queues" else [v]) if part]
        return out
    if base is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be true or false, got {value!r}", source)
    if base in (int, float):
        if isinstance(value, bool):
            raise ConfigError(key, f"must be {_describe(base)}, got {value!r}", source)
        if isinstance(value, int | float) and (base is float or isinstance(value, int)):
            return base(value)
        if isinstance(value, str):
            try:
                return base(value.strip())
            except ValueError:
                pass
        raise ConfigError(key, f"must be {_describe(base)}, got {value!r}", source)
    if base is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, f"must be a string, got {value!r}", source)
    raise ConfigError(key, f"cannot be set from {source}", source)


def load_file(path: str) -> dict[str, tuple[Any, str]]:
    """The settings in a TOML file, as {key: (value, source)}. A [herder] table or top level."""
    source = f"file {path}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("config", f"no such file: {path}", "command line or HERDER_CONFIG") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", f"not valid TOML: {exc}", source) from None
    table = data.get("herder", data)
    if not isinstance(table, dict):
        raise ConfigError("herder", "must be a table", source)
    out: dict[str, tuple[Any, str]] = {}
    for raw_key, value in table.items():
        key = normalize_key(raw_key)
        out[key] = (coerce(key, value, source), source)
    return out


def resolve(layers: list[dict[str, tuple[Any, str]]]) -> tuple[Config, dict[str, str]]:
    """Apply layers in order (later wins) over the defaults; validate; return config and sources."""
    cfg = Config()
    sources: dict[str, str] = {}
    for layer in layers:
        for key, (value, source) in layer.items():
            setattr(cfg, key, coerce(key, value, source))
            sources[key] = source
    if layers and "workers" in layers[-1] and "max_workers" in sources:
        # A fixed count given last (flags, environment) would silently lose to autoscaling.
        raise ConfigError(
            "workers", "a fixed count conflicts with max_workers (autoscaling)", sources["workers"]
        )
    cfg.validate(sources)
    return cfg, sources


def describe(cfg: Config, sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, value, source) for every setting, secrets redacted: what `herder config` prints."""
    rows = []
    for key in KEYS:
        value = getattr(cfg, key)
        shown = redact_url(value) if key in SECRET_KEYS else value
        if key == "workers_limit" and value is None:
            shown = f"{cfg.limit} ({default_workers_limit()[1]})"
        if isinstance(shown, list):
            shown = ", ".join(map(str, shown)) if key != "worker_command" else " ".join(shown)
        rows.append((key, "" if shown is None else str(shown), sources.get(key, "default")))
    return rows


def example_file() -> str:
    """A commented TOML file with every setting at its default."""
    lines = ["# herder configuration (TOML). Flags and HERDER_* variables override these.", "[herder]"]
    for key in KEYS:
        value = getattr(Config(), key)
        if value is None or value == "" or value == []:
            lines.append(f"# {key} = ")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, str):
            lines.append(f'{key} = "{value}"')
        elif isinstance(value, list):
            lines.append(f"{key} = [{', '.join(repr(v).replace(chr(39), chr(34)) for v in value)}]")
        else:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def reread(cfg: Config) -> Config:
    """`cfg` with its file layer read again (reload); keys pinned by environment or flags
    stay, and what `herder run` filled in itself (the state dir, the embedded Redis) stays
    while the file still does not set it. Every other difference is a change: reload_plan
    says what becomes of it."""
    assert cfg.config_file
    pinned = {k: (getattr(cfg, k), "environment or command line") for k in cfg.pinned}
    fresh, _ = resolve([load_file(cfg.config_file), pinned])
    fresh.config_file, fresh.pinned, fresh.defaulted = cfg.config_file, cfg.pinned, cfg.defaulted
    fresh.embedded_redis = cfg.embedded_redis
    if cfg.embedded_redis and fresh.redis_url is None:
        fresh.redis_url = cfg.redis_url  # the watchdog's private Redis stays where it is
    if fresh.state_dir:
        fresh.state_dir = str(Path(fresh.state_dir).absolute())  # as `herder run` made it
    elif "state_dir" in cfg.defaulted:
        fresh.state_dir = cfg.state_dir
    return fresh


@dataclass(frozen=True)
class ReloadPlan:
    applied: list[str]  # changed keys the master applies in place
    restart_workers: list[str]  # changed keys only new workers pick up: a rolling restart


def reload_policy(key: str) -> str:
    return next(f.metadata["reload"] for f in fields(Config) if f.name == key)


def reload_plan(running: Config, new: Config, started: Config) -> ReloadPlan:
    """What a reload from `running` to `new` does, or ConfigError naming every changed key it
    cannot apply (then nothing changes). `started`: the config herder (and its watchdog,
    which never re-reads it) started with."""
    changed = [k for k in KEYS if getattr(new, k) != getattr(running, k)]
    refused = {k: "read once at start" for k in changed if reload_policy(k) == RESTART}
    if (running.cluster_max_workers is None) != (new.cluster_max_workers is None):
        refused["cluster_max_workers"] = "turning the cluster cap on or off changes how this host reserves"
    if new.drain_seconds > started.drain_seconds:
        why = (
            f"stop_timeout + kill_timeout would be {new.drain_seconds:g} s, more than the "
            f"{started.drain_seconds:g} s the watchdog allows a stop since herder started"
        )
        refused.update({k: why for k in ("stop_timeout", "kill_timeout") if k in changed})
    if refused:
        source = f"file {running.config_file}"
        reasons = "; ".join(f"{k}: {why}" for k, why in refused.items())
        raise ConfigError(
            ", ".join(refused),
            f"changed, but only a restart of herder applies it ({reasons}); the running config is kept",
            source,
        )
    return ReloadPlan(
        applied=[k for k in changed if reload_policy(k) == APPLY],
        restart_workers=[k for k in changed if reload_policy(k) == WORKERS],
    )
