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

import json
import os
import re
import shlex
import tomllib
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from herder.common.exits import EX_CONFIG

__all__ = ["EX_CONFIG", "Config", "ConfigError", "reread", "resolve", "load_file"]

ENV_RESOLVED = "HERDER_RESOLVED_CONFIG"


class ConfigError(Exception):
    def __init__(self, key: str, message: str, source: str = "default") -> None:
        super().__init__(f"config key {key!r} from {source}: {message}")
        self.key = key
        self.source = source


def setting(default: Any = None, help: str = "", factory: Any = None) -> Any:  # noqa: A002
    """A user setting: its default and the help its flag shows (`herder run --help`)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


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
        help="Queue to work on (repeatable), in priority order.", factory=lambda: ["default"]
    )
    workers: int = setting(2, "Number of workers (fixed).")
    # Autoscaling: on when max_workers is set (then `workers` is ignored).
    min_workers: int | None = setting(None, "Autoscale: never fewer workers than this (default 1).")
    max_workers: int | None = setting(None, "Autoscale up to this many workers (turns autoscaling on).")
    scale_interval: float = setting(1.0, "Seconds between load readings (one Redis round trip).")
    scale_down_delay: float = setting(30.0, "Seconds the need must stay low before workers stop.")
    drain_target: float = setting(30.0, "Size the fleet to empty the backlog within this many seconds.")
    # Several hosts on one Redis: a cap on the whole cluster's workers.
    host_id: str = setting("", "This host's name in a cluster (default hostname:pid).")
    cluster_max_workers: int | None = setting(None, "Cap on the workers of all hosts on this Redis.")
    host_ttl: float = setting(10.0, "Seconds after which a silent host is forgotten.")
    # Deadline for a job whose busy line carries no timeout (RQ's own default is 180 s).
    job_timeout: float = setting(180.0, "Seconds a job may run when it does not set its own timeout.")
    # RQ's in-process alarm fires at the timeout; this is the backstop for code it cannot stop.
    job_timeout_grace: float = setting(10.0, "Seconds past its timeout before herder kills a job.")
    heartbeat_interval: float = setting(1.0, "Seconds between a worker's heartbeat lines.")
    heartbeat_timeout: float = setting(10.0, "Seconds of worker silence before it is killed.")
    start_timeout: float = setting(30.0, "Seconds a new worker has to say `ready`.")
    stop_timeout: float = setting(30.0, "Seconds a stopping worker has to finish its job.")
    kill_timeout: float = setting(5.0, "Seconds from SIGTERM to SIGKILL.")
    max_requeues: int = setting(3, "Times a dead worker's job is requeued before it is failed.")
    # How often a master looks for jobs no live worker holds (docs/design.md, "Jobs are never lost").
    sweep_interval: float = setting(2.0, "Seconds between sweeps for jobs whose worker is gone.")
    # A widespread fault must not take every worker (cluster-wide too with a cluster cap).
    kill_budget: float = setting(0.5, "Share of the fleet that may be killed as hung per budget window.")
    kill_budget_window: float = setting(60.0, "Seconds of the kill budget's sliding window.")
    min_uptime: float = setting(1.0, "A worker exiting sooner than this died young: its slot backs off.")
    backoff_initial: float = setting(0.1, "Seconds a slot waits after its first young death (then doubling).")
    backoff_max: float = setting(30.0, "The longest a slot's backoff grows.")
    # Watchdog: master silence deadline and restart intensity.
    master_heartbeat_timeout: float = setting(15.0, "Master silence before a restart.")
    max_restarts: int = setting(5, "Master restarts within --restart-window before giving up.")
    restart_window: float = setting(60.0, "Seconds.")
    paths: list[str] = setting(help="Directory to import job modules from (repeatable).", factory=list)
    worker_command: list[str] | None = setting(
        None, "Run this program as the worker (it must speak the protocol)."
    )
    state_dir: str = setting(
        "",
        "Directory for herder's state, 0700 (default /run/herder as root, else $XDG_RUNTIME_DIR/herder-UID).",
    )
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR.")
    user: str = setting("", "Started as root: run the master, workers and embedded Redis as this user.")
    # RQ's scheduler (enqueue_at/enqueue_in, Retry intervals): one child per host, RQ's locks
    # pick one per queue across hosts (docs/design.md, "RQ's scheduler").
    scheduler: bool = setting(
        True, "Run RQ's scheduler (off: it runs elsewhere, e.g. rq worker --with-scheduler)."
    )
    config_file: str | None = internal()  # where the file layer came from, for reload
    embedded_redis: bool = internal(False)  # no redis_url given: the watchdog runs a private redis-server
    pinned: list[str] = internal(factory=list)  # keys set by environment or flags: reload keeps them

    def validate(self, sources: dict[str, str] | None = None) -> None:
        src = sources or {}

        def bad(key: str, message: str) -> ConfigError:
            return ConfigError(key, message, src.get(key, "default"))

        if self.workers < 1:
            raise bad("workers", f"must be at least 1, got {self.workers}")
        if self.min_workers is not None and self.max_workers is None:
            raise bad("min_workers", "needs max_workers too (autoscaling is on when max_workers is set)")
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
        ]
        for key in positive:
            if not getattr(self, key) > 0:
                raise bad(key, f"must be greater than 0, got {getattr(self, key)}")
        for key in ("job_timeout_grace", "stop_timeout", "min_uptime"):
            if getattr(self, key) < 0:
                raise bad(key, f"must not be negative, got {getattr(self, key)}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise bad("heartbeat_timeout", "must be longer than heartbeat_interval")
        if self.max_requeues < 0:
            raise bad("max_requeues", "must not be negative")
        if self.max_restarts < 1:
            raise bad("max_restarts", "must be at least 1")
        if self.redis_url is not None:
            scheme = urlsplit(self.redis_url).scheme
            if scheme not in ("redis", "rediss", "unix"):
                raise bad("redis_url", f"scheme must be redis://, rediss:// or unix://, got {scheme!r}")
        if self.worker_command is not None and not self.worker_command:
            raise bad("worker_command", "is empty")
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
    def orphan_log(self) -> str | None:
        """Where a worker whose master died writes what its last job prints."""
        return os.path.join(self.state_dir, "orphaned-workers.log") if self.state_dir else None

    @property
    def lease_seconds(self) -> float:
        """How long a worker's lease outlives its last renewal. The worker renews it every
        heartbeat interval, its master every sweep: three missed renewals mean gone."""
        return max(5.0, 3 * max(self.sweep_interval, self.heartbeat_interval))

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
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


# ---- layering: defaults < TOML file < HERDER_* environment < flags ----------------------

# Keys a user may write in a file or flag that map to another field name.
ALIASES = {"queue": "queues", "path": "paths"}
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
    stay, and so does what `herder run` decided once (state dir, host id, embedded Redis)."""
    assert cfg.config_file
    pinned = {k: (getattr(cfg, k), "environment or command line") for k in cfg.pinned}
    fresh, _ = resolve([load_file(cfg.config_file), pinned])
    fresh.config_file, fresh.pinned, fresh.state_dir = cfg.config_file, cfg.pinned, cfg.state_dir
    fresh.host_id = cfg.host_id
    fresh.embedded_redis = cfg.embedded_redis
    if cfg.embedded_redis and fresh.redis_url is None:
        fresh.redis_url = cfg.redis_url  # the watchdog's private Redis stays where it is
    return fresh
