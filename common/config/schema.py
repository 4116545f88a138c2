"""The settings schema: one dataclass that the CLI, watchdog, master and worker all read.
Each field is a setting with its default, the help its flag shows and what a reload does with
it; the names a user writes for it (flag, HERDER_* variable, TOML key) are derived here too.
Standard library only.

The Config travels from `herder run` to the watchdog, master and workers as JSON on an
inherited descriptor or in a fork request (herder.common.handover): never on argv, where a
Redis password would show in `ps`, nor in the environment, where a job's code would read it.
"""

from __future__ import annotations

import copy
import json
import os
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from herder.common import handover
from herder.common.config.limits import default_workers_limit
from herder.common.handover import ENV_RESOLVED

WORKER_NICE = 5  # docs/design.md, "The master's share of the CPU"


class ConfigError(Exception):
    def __init__(self, key: str, message: str, source: str = "default") -> None:
        super().__init__(f"config key {key!r} from {source}: {message}")
        self.key = key
        self.message = message
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
    pool: bool = False,
) -> Any:
    """A user setting: its default, the help its flag shows (`herder run --help`), what a
    reload does with it (refused unless said otherwise: a reload never claims what it did not do)
    and whether a `[pools.NAME]` table may set it (`pool`: it belongs to a fleet; host-wide
    settings do not). pools.POOL_KEYS is read from these flags."""
    meta = {"help": help, "reload": reload, "pool": pool}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def internal(default: Any = None, factory: Any = None) -> Any:
    """Bookkeeping `herder run` fills in itself: not a setting a user writes."""
    if factory is not None:
        return field(default_factory=factory, metadata={"internal": True})
    return field(default=default, metadata={"internal": True})


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
        pool=True,
    )
    workers: int = setting(2, "Number of workers (fixed).", reload=APPLY, pool=True)
    # Autoscaling: on when max_workers is set (then `workers` is ignored).
    min_workers: int | None = setting(
        None,
        "Autoscale: never fewer workers than this (default 1).",
        reload=APPLY,
        pool=True,
    )
    max_workers: int | None = setting(
        None,
        "Autoscale up to this many workers (turns autoscaling on).",
        reload=APPLY,
        pool=True,
    )
    # The hard ceiling on this host's worker processes (docs/operations.md, "Workers limit").
    workers_limit: int | None = setting(
        None,
        # The host's own figure is for --help alone (cli.py): docs/settings.md is the same everywhere.
        "The most worker processes this host runs, whatever is asked "
        "(default min(16 x CPUs, memory / 64 MiB)).",
        reload=APPLY,
    )
    scale_interval: float = setting(
        1.0,
        "Seconds between load readings (one Redis round trip).",
        reload=APPLY,
        pool=True,
    )
    scale_down_delay: float = setting(
        2.0,
        "Seconds the need must stay low before workers stop (with max_wait: at most max_wait / 2).",
        reload=APPLY,
        pool=True,
    )
    drain_target: float = setting(
        30.0,
        "Size the fleet to empty the backlog within this many seconds.",
        reload=APPLY,
        pool=True,
    )
    max_wait: float | None = setting(
        None,
        "Latency target: autoscale so that no job waits in its queue longer than this many seconds.",
        reload=APPLY,
        pool=True,
    )
    # Several hosts on one Redis: a cap on the whole cluster's workers.
    host_id: str = setting("", "This host's name in a cluster (default hostname:pid).")
    # A new value applies; turning the cap on or off needs a restart (reload_plan).
    cluster_max_workers: int | None = setting(
        None,
        "Cap on the workers of all hosts on this Redis.",
        reload=APPLY,
        pool=True,
    )
    host_ttl: float = setting(
        10.0, "Seconds after which a silent host is forgotten.", reload=APPLY, pool=True
    )
    # Deadline for a job whose busy line carries no timeout (RQ's own default is 180 s).
    job_timeout: float = setting(
        180.0,
        "Seconds a job may run when it does not set its own timeout.",
        reload=APPLY,
        pool=True,
    )
    # RQ's in-process alarm fires at the timeout; this is the backstop for code it cannot stop.
    job_timeout_grace: float = setting(
        10.0,
        "Seconds past its timeout before herder kills a job.",
        reload=APPLY,
        pool=True,
    )
    heartbeat_interval: float = setting(
        1.0, "Seconds between a worker's heartbeat lines.", reload=WORKERS, pool=True
    )
    heartbeat_timeout: float = setting(
        10.0, "Seconds of worker silence before it is killed.", reload=APPLY, pool=True
    )
    # The network is not reliable (docs/design.md): no Redis call of a worker waits unbounded, and
    # a worker whose loop stalls outside a job while its beat goes on is killed.
    redis_timeout: float = setting(
        5.0,
        "Seconds a worker waits for a Redis reply before it gives the connection up and tries again "
        "on a new one (3 times for RQ's own calls; until Redis answers for the fast path's).",
        reload=WORKERS,
    )
    progress_timeout: float = setting(
        30.0,
        "Seconds a busy worker's loop may make no progress outside its job's own code (a Redis "
        "call, a dequeue) before it is killed and its job recovered.",
        reload=APPLY,
    )
    start_timeout: float = setting(30.0, "Seconds a new worker has to say `ready`.", reload=APPLY, pool=True)
    # Both only downwards: the watchdog's stop grace was set from them at start (reload_plan).
    stop_timeout: float = setting(
        30.0, "Seconds a stopping worker has to finish its job.", reload=APPLY, pool=True
    )
    kill_timeout: float = setting(5.0, "Seconds from SIGTERM to SIGKILL.", reload=APPLY, pool=True)
    max_requeues: int = setting(
        3, "Times a dead worker's job is requeued before it is failed.", reload=APPLY, pool=True
    )
    # The master must win the CPU against its own busy workers to see deaths and hangs at once.
    worker_nice: int = setting(
        WORKER_NICE,
        "Niceness workers run at (0-19), above the master's, so it stays responsive.",
        reload=WORKERS,
        pool=True,
    )
    # How often a master looks for jobs no live worker holds (docs/design.md, "Jobs are never lost").
    sweep_interval: float = setting(
        1.0, "Seconds between sweeps for jobs whose worker is gone.", reload=APPLY
    )
    # A widespread fault must not take every worker (cluster-wide too with a cluster cap).
    kill_budget: float = setting(
        0.5, "Share of the fleet that may be killed as hung per budget window.", reload=APPLY
    )
    kill_budget_window: float = setting(60.0, "Seconds of the kill budget's sliding window.", reload=APPLY)
    min_uptime: float = setting(
        1.0,
        "Seconds: a worker exiting sooner than this died young, and its slot backs off.",
        reload=APPLY,
        pool=True,
    )
    backoff_initial: float = setting(
        0.1,
        "Seconds a slot waits after its first young death (then doubling).",
        reload=APPLY,
        pool=True,
    )
    backoff_max: float = setting(
        30.0, "The longest a slot's backoff grows, in seconds.", reload=APPLY, pool=True
    )
    # Watchdog: master silence deadline and restart intensity.
    master_heartbeat_timeout: float = setting(15.0, "Seconds of master silence before a restart.")
    max_restarts: int = setting(5, "Master restarts within --restart-window before giving up.")
    restart_window: float = setting(60.0, "Seconds.")
    paths: list[str] = setting(
        help="Directory to import job modules from (repeatable).",
        factory=list,
        reload=WORKERS,
        pool=True,
    )
    worker_command: list[str] | None = setting(
        None, "Run this program as the worker (it must speak the protocol).", reload=WORKERS
    )
    state_dir: str = setting(
        "",
        "Directory for herder's state, 0700 (default /run/herder as root, else $XDG_RUNTIME_DIR/herder-UID, "
        "or /tmp/herder-UID without XDG_RUNTIME_DIR; "
        "a service from install-service: /var/lib/herder, or /usr/local/var/herder on macOS).",
    )
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR.", reload=WORKERS)
    log_format: str = setting("text", 'text, or json: one JSON object per line (docs/monitoring.md, "Logs").')
    user: str = setting("", "Started as root: run the master, workers and embedded Redis as this user.")
    # Self-defense: cull a worker whose jobs keep failing (within a shared budget), and recycle
    # workers by jobs, age and memory, a replacement first (docs/design.md, "Self-defense").
    cull_failures: int = setting(
        5,
        "Failed jobs within --cull-failure-window that get a worker culled (0: never).",
        reload=APPLY,
        pool=True,
    )
    cull_failure_window: float = setting(
        60.0,
        "Seconds over which a worker's failed jobs are counted.",
        reload=APPLY,
        pool=True,
    )
    cull_budget: int = setting(
        10, "Culls allowed per --cull-window, for all hosts on this Redis.", reload=APPLY
    )
    cull_window: float = setting(600.0, "Seconds of the cull budget's sliding window.", reload=APPLY)
    max_jobs: int | None = setting(
        None,
        "A worker takes at most this many jobs, then is replaced (its replacement starts ahead).",
        reload=APPLY,
        pool=True,
    )
    max_jobs_jitter: int = setting(
        0,
        "Up to this many jobs more, at random per worker, so they recycle apart.",
        reload=APPLY,
        pool=True,
    )
    max_age: float | None = setting(
        None, "Recycle a worker after this many seconds.", reload=APPLY, pool=True
    )
    max_age_jitter: float = setting(
        0.0, "Up to this many seconds more, at random per worker.", reload=APPLY, pool=True
    )
    max_memory: float | None = setting(
        None,
        "Recycle a worker past this RSS in MiB: it takes no more jobs, and is replaced.",
        reload=APPLY,
        pool=True,
    )
    max_memory_hard: float | None = setting(
        None,
        "Kill a worker past this RSS in MiB (default 1.5 x --max-memory).",
        reload=APPLY,
        pool=True,
    )
    recycle_share: float = setting(
        0.1,
        "At most this share of the fleet (at least 1) recycles at once.",
        reload=APPLY,
        pool=True,
    )
    # RQ's scheduler (enqueue_at/enqueue_in, Retry intervals): one child per host, RQ's locks
    # pick one per queue across hosts (docs/design.md, "RQ's scheduler").
    scheduler: bool = setting(
        True,
        "Run RQ's scheduler (off: it runs elsewhere, e.g. rq worker --with-scheduler).",
        reload=APPLY,
    )
    # RQ's cron (rq cron): run in the scheduler process, in one place per Redis (docs/design.md).
    cron: str = setting(
        "",
        "RQ cron config (as `rq cron` takes it): a module or .py file whose rq.cron.register calls "
        "define the jobs; one host on this Redis runs them, another takes over if it dies.",
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
        pool=True,
    )
    # Jobs at once per worker process, one per thread (docs/operations.md, "Threads").
    threads: int = setting(
        1,
        "Jobs each worker process runs at once, one per thread, each thread an RQ worker of its "
        "own (I/O-bound, thread-safe job code; the workers limit still counts processes).",
        reload=WORKERS,
        pool=True,
    )
    # RQ's per-job writes in one round trip instead of about eleven: a job's finish, the next
    # job's take and its start in one script call (docs/design.md, "Fast path").
    fast_path: bool = setting(
        True,
        "Do RQ's per-job bookkeeping in 1 round trip (off: RQ's own code path, call by call; "
        "a --worker-class, --queue-class or other dequeue strategy always takes RQ's).",
        reload=WORKERS,
    )
    # `rq worker`'s own options, for users coming from it (docs/migrating-from-rq.md).
    worker_class: str = setting(
        "",
        "RQ Worker class (dotted path) to combine with herder's protocol (rq worker -w).",
        reload=WORKERS,
        pool=True,
    )
    job_class: str = setting("", "RQ Job class, dotted path (rq worker -j).", reload=WORKERS, pool=True)
    queue_class: str = setting(
        "", "RQ Queue class, dotted path (rq worker --queue-class).", reload=WORKERS, pool=True
    )
    serializer: str = setting(
        "",
        "json, pickle, or a serializer's dotted path (rq worker -S).",
        reload=WORKERS,
        pool=True,
    )
    exception_handlers: list[str] = setting(
        help="Exception handler, dotted path (repeatable; rq worker --exception-handler).",
        factory=list,
        reload=WORKERS,
        pool=True,
    )
    disable_default_exception_handler: bool = setting(
        False,
        "Do not move failed jobs to the FailedJobRegistry (rq worker -d).",
        reload=WORKERS,
        pool=True,
    )
    results_ttl: int | None = setting(
        None,
        "Seconds results are kept (rq worker --results-ttl).",
        reload=WORKERS,
        pool=True,
    )
    worker_ttl: int | None = setting(
        None,
        "RQ's worker key TTL in seconds (rq worker --worker-ttl).",
        reload=WORKERS,
        pool=True,
    )
    maintenance_interval: int | None = setting(
        None,
        "Seconds between RQ's maintenance passes (rq worker --maintenance-interval).",
        reload=WORKERS,
        pool=True,
    )
    dequeue_strategy: str = setting(
        "default",
        "default, random or round_robin (rq worker --dequeue-strategy).",
        reload=WORKERS,
        pool=True,
    )
    rq_config: str = setting(
        "",
        "RQ's settings module (rq worker -c): REDIS_URL (or REDIS_HOST, _PORT, _DB, _PASSWORD, _SSL) "
        "and QUEUES, below the file, the environment and the flags.",
    )
    # Health and metrics for load balancers, probes and Prometheus (docs/monitoring.md).
    http: str = setting(
        "",
        "Serve /healthz, /metrics and the dashboard on [ADDR:]PORT (off by default; a bare PORT binds "
        "127.0.0.1).",
    )
    http_token_file: str = setting(
        "",
        "A file holding the token that unlocks the --http dashboard's controls (scale, pause, resume, "
        "restart, stop a worker); or give the token itself in HERDER_HTTP_TOKEN. Without one the "
        "dashboard is read-only.",
    )
    health_grace: float = setting(
        10.0,
        "Seconds the fleet may be below its minimum of ready workers, or Redis unreachable, "
        "before health says degraded.",
        reload=APPLY,
    )
    # Event hooks: a push when something happens (docs/monitoring.md, "Event hooks").
    on_event: str = setting(
        "",
        "Run this command (no shell) with each event as JSON on its stdin: a worker killed or culled, "
        "a budget spent, a job given up, the master restarted, health changing.",
        reload=APPLY,
    )
    on_event_url: str = setting("", "POST each event's JSON to this http(s) URL.", reload=APPLY)
    on_event_timeout: float = setting(
        10.0, "Seconds an event hook may run (or a webhook take) before it is killed.", reload=APPLY
    )
    # User code at worker start (docs/operations.md, "Django" and "Worker start-up hook").
    worker_init: str = setting(
        "",
        "Call module:function in every worker before its first job (close inherited connections, "
        "a tracer's init); if it raises, the worker fails to start and its slot backs off.",
        reload=WORKERS,
        pool=True,
    )
    django_settings: str = setting(
        "",
        "Django settings module (default: DJANGO_SETTINGS_MODULE): django.setup() runs in the warm "
        "template before workers fork, each worker closes inherited database connections, and "
        "django-rq's RQ_QUEUES names the Redis and queues when no redis_url or queues are given.",
        reload=WORKERS,
    )
    # Several pools (docs/operations.md, "Pools"): [pools.NAME] tables of the file only, each a
    # fleet's settings over the ones above (herder.common.config.pools). Empty: one pool, "default".
    pools: dict[str, dict[str, Any]] = internal(factory=dict)
    config_file: str | None = internal()  # where the file layer came from, for reload
    embedded_redis: bool = internal(False)  # no redis_url given: the watchdog runs a private redis-server
    pinned: list[str] = internal(factory=list)  # keys set by environment or flags: reload keeps them
    defaulted: list[str] = internal(factory=list)  # keys `herder run` filled in itself (state_dir)
    # The dashboard's token from HERDER_HTTP_TOKEN: `herder run` moves it here, out of the environment
    # it hands on; the master takes it out of its Config before anything is started from it.
    http_token: str = internal("")

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

    def bound(self, count: int) -> int:
        """`count` within [floor, ceiling]: how every layer applies min_workers and max_workers."""
        return max(self.floor, min(self.ceiling, count))

    @property
    def limit(self) -> int:
        """The most worker processes this host runs: workers_limit, else computed from the host."""
        return self.workers_limit if self.workers_limit is not None else default_workers_limit()[0]

    @property
    def limit_reason(self) -> str:
        """How the limit was reached: the setting, or the host's figures (a cgroup's named)."""
        return "workers_limit" if self.workers_limit is not None else default_workers_limit()[1]

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
        heartbeat interval, its master every sweep: three missed renewals of both mean gone
        (3 s with the defaults, so a host that dies whole has its jobs back within ~4 s)."""
        return max(3.0, 3 * max(self.sweep_interval, self.heartbeat_interval))

    @property
    def memory_hard_limit(self) -> float | None:
        """MiB of RSS past which a worker is killed at once, job or not."""
        if self.max_memory_hard is not None:
            return self.max_memory_hard
        return None if self.max_memory is None else 1.5 * self.max_memory

    @property
    def drain_seconds(self) -> float:
        """The longest a graceful stop can take: every job's stop timeout, then the kill (the
        longest of any pool's)."""
        own = self.stop_timeout + self.kill_timeout
        return max(
            [own]
            + [
                p.get("stop_timeout", self.stop_timeout) + p.get("kill_timeout", self.kill_timeout)
                for p in self.pools.values()
            ]
        )

    def to_json(self) -> str:
        """The whole resolved Config, as a child is handed it (herder.common.handover)."""
        return json.dumps(asdict(self))

    @classmethod
    def handed_over(cls) -> Config:
        """The Config this process was handed at its start (herder.common.handover)."""
        raw = handover.receive()
        if not raw:
            raise ConfigError(ENV_RESOLVED, "not handed over: start herder with `herder run`", "its parent")
        # The fork server parses its config before it forks: a worker given the same one takes
        # a copy of that parse instead of a millisecond of its way to `ready`.
        if _last_parsed and _last_parsed[0] == raw:
            return copy.copy(_last_parsed[1])
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in data.items() if k in known})
        _last_parsed[:] = [raw, cfg]
        return copy.copy(cfg)


_last_parsed: list[Any] = []  # [the raw JSON, its Config] of the last handed_over


# ---- the names a user writes: flag, HERDER_* variable, TOML key ------------------------

# Keys a user may write in a file or flag that map to another field name.
ALIASES = {"queue": "queues", "path": "paths", "exception_handler": "exception_handlers"}
SECRET_KEYS = {"redis_url", "on_event_url"}  # URLs that may carry a password: shown redacted
KEYS = [f.name for f in fields(Config) if not f.metadata.get("internal")]
HELP = {f.name: f.metadata["help"] for f in fields(Config) if f.name in KEYS}


def metavar(key: str) -> str | None:
    """What a number setting's flag shows in --help and docs/settings.md: SECONDS, MiB, INTEGER
    or FLOAT (a plain number: "30", never "30s"); None for the others (click's own)."""
    hint = typing.get_type_hints(Config)[key]
    number = {int, float} & {hint, *typing.get_args(hint)}
    if not number:
        return None
    if "in MiB" in HELP[key]:
        return "MiB"
    if "second" in HELP[key].lower():
        return "SECONDS"
    return "INTEGER" if int in number else "FLOAT"


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
