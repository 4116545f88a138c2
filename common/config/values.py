"""Coercion and validation: every raw value (a TOML value, a string from the environment or a
flag) becomes the type its Config field has, and a resolved Config is checked as a whole.
Each error names the key and where its value came from, so `herder run` exits 78 (EX_CONFIG)
with one message a person can act on. Standard library only."""

from __future__ import annotations

import os
import re
import shlex
import typing
from typing import Any
from urllib.parse import urlsplit

from herder.common.config.schema import KEYS, SECRET_KEYS, Config, ConfigError, OverLimit
from herder.common.rq_support import NEEDS_RQ, unsupported_rq_setting

MAX_THREADS = 255  # herder.common.worker_protocol.MAX_THREADS - 1: a thread's tag must fit
RETRIES = 3  # herder.common.redis_connect.RETRIES (that module imports redis: not here)

_TYPES = {k: v for k, v in typing.get_type_hints(Config).items() if k in KEYS}


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


def redact_setting(key: str, value: Any) -> Any:
    """A setting as logs, status and `herder config` show it: a Redis URL without its password,
    a webhook URL without its path, query or user (Slack's and Discord's carry the secret in
    the path)."""
    if key == "on_event_url" and value:
        parts = urlsplit(value)
        where = f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        hidden = parts.path not in ("", "/") or parts.query or parts.username
        return where + ("/***" if hidden else "")
    if key in SECRET_KEYS:
        return redact_url(value)
    return value


_USERINFO_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/@?#]*:)[^@/?#]*(@)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"([?&][a-z_]*password=)[^&#]*", re.IGNORECASE)  # sentinel_password= too


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
            try:
                return parse_worker_command(value)
            except ValueError as exc:  # shlex: an unclosed quote, a trailing escape
                raise ConfigError(key, f"cannot be split as a shell would: {exc}", source) from None
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


def validate(cfg: Config, sources: dict[str, str] | None = None) -> None:
    """The whole Config's rules (counts within the workers limit, positive timings, names that
    can be imported): raise ConfigError naming the first broken one and its source."""
    src = sources or {}

    def bad(key: str, message: str, kind: type[ConfigError] = ConfigError) -> ConfigError:
        return kind(key, message, src.get(key, "default"))

    if cfg.workers < 1:
        raise bad("workers", f"must be at least 1, got {cfg.workers}")
    if cfg.min_workers is not None and cfg.max_workers is None:
        raise bad("min_workers", "needs max_workers too (autoscaling is on when max_workers is set)")
    if cfg.workers_limit is not None and cfg.workers_limit < 1:
        raise bad("workers_limit", f"must be at least 1, got {cfg.workers_limit}")
    for key in ("max_workers", "min_workers") if cfg.autoscale else ("workers",):
        count = getattr(cfg, key)
        if count is not None and count > cfg.limit:
            raise bad(key, f"{count} is above {cfg.describe_limit()}", OverLimit)
    if cfg.max_workers is not None:
        if cfg.max_workers < 1:
            raise bad("max_workers", f"must be at least 1, got {cfg.max_workers}")
        if cfg.min_workers is not None and not 0 <= cfg.min_workers <= cfg.max_workers:
            raise bad(
                "min_workers",
                f"must be between 0 and max_workers ({cfg.max_workers}), got {cfg.min_workers}",
            )
    if cfg.cluster_max_workers is not None:
        if cfg.max_workers is None:
            raise bad("cluster_max_workers", "needs max_workers (autoscaling) too")
        if cfg.cluster_max_workers < 1:
            raise bad("cluster_max_workers", f"must be at least 1, got {cfg.cluster_max_workers}")
    if cfg.host_ttl <= cfg.scale_interval:
        raise bad("host_ttl", "must be longer than scale_interval")
    # Any name RQ accepts, spaces included; not an empty or unprintable one (a typo, not a queue).
    if not cfg.queues or any(not q or not q.isprintable() for q in cfg.queues):
        raise bad("queues", "needs one or more queue names, each non-empty and printable")
    if cfg.worker_command and any("," in q for q in cfg.queues):  # its HERDER_QUEUES is comma-separated
        raise bad("queues", "a queue name with a comma cannot reach a worker_command (HERDER_QUEUES)")
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
        "on_event_timeout",
        "redis_timeout",
        "progress_timeout",
    ]
    for key in positive:
        if not getattr(cfg, key) > 0:
            raise bad(key, f"must be greater than 0, got {getattr(cfg, key)}")
    for key in NEEDS_RQ:  # asked for on an rq that cannot serve it: one line naming the rq it needs
        if src.get(key, "default") != "default":
            why = unsupported_rq_setting(key, getattr(cfg, key))
            if why:
                raise bad(key, why)
    if not 0 <= cfg.worker_nice <= 19:
        raise bad("worker_nice", f"must be 0 to 19 (a niceness), got {cfg.worker_nice}")
    for key in ("cull_failures", "cull_budget", "max_jobs_jitter", "max_age_jitter"):
        if getattr(cfg, key) < 0:
            raise bad(key, f"must not be negative, got {getattr(cfg, key)}")
    for key in ("max_jobs", "max_age", "max_memory", "max_memory_hard", "max_wait"):
        if getattr(cfg, key) is not None and not getattr(cfg, key) > 0:
            raise bad(key, f"must be greater than 0, got {getattr(cfg, key)}")
    if (
        cfg.max_memory_hard is not None
        and cfg.max_memory is not None
        and cfg.max_memory_hard <= cfg.max_memory
    ):
        raise bad("max_memory_hard", "must be above max_memory (the soft limit recycles between jobs)")
    for key in ("job_timeout_grace", "stop_timeout", "min_uptime"):
        if getattr(cfg, key) < 0:
            raise bad(key, f"must not be negative, got {getattr(cfg, key)}")
    # An idle RQ worker speaks once per dequeue slice of max(1 s, heartbeat_interval)
    # (worker/dequeue.py); a timeout that does not outlast two slices kills healthy ones.
    slice_s = max(1.0, cfg.heartbeat_interval)
    if cfg.heartbeat_timeout < 2 * slice_s:
        raise bad(
            "heartbeat_timeout",
            f"must be at least twice max(1 s, heartbeat_interval), {2 * slice_s:g} s, got "
            f"{cfg.heartbeat_timeout:g}: an idle worker speaks only once per {slice_s:g} s dequeue "
            "slice, so a shorter timeout would kill healthy idle workers",
        )
    if cfg.redis_timeout <= 1:
        raise bad(
            "redis_timeout",
            f"must be longer than 1 s, got {cfg.redis_timeout:g}: a worker's blocking dequeue waits up to "
            "a second for a job (longer on Redis before 6: its slice, and the worker waits that plus 1 s)",
        )
    longest_call = (RETRIES + 1) * cfg.redis_timeout + 2  # one of RQ's calls, tried again each time
    if cfg.progress_timeout <= longest_call:
        raise bad(
            "progress_timeout",
            f"must be longer than {RETRIES + 1} times redis_timeout ({cfg.redis_timeout:g} s) and 2 s, "
            f"{longest_call:g} s, got {cfg.progress_timeout:g}: a worker still trying one Redis call would "
            "be killed as stuck",
        )
    if cfg.max_requeues < 0:
        raise bad("max_requeues", "must not be negative")
    if cfg.max_restarts < 1:
        raise bad("max_restarts", "must be at least 1")
    if cfg.redis_url is not None:
        scheme = urlsplit(cfg.redis_url).scheme
        if scheme not in ("redis", "rediss", "unix", "redis+sentinel"):
            raise bad(
                "redis_url",
                f"scheme must be redis://, rediss://, unix:// or redis+sentinel://, got {scheme!r}",
            )
    if not 1 <= cfg.threads <= MAX_THREADS:
        raise bad("threads", f"must be 1 to {MAX_THREADS}, got {cfg.threads}")
    if cfg.threads > 1 and cfg.worker_command is not None:
        raise bad("threads", "a worker_command runs its own way: threads are for herder's RQ workers")
    if cfg.threads > 1 and cfg.worker_class:
        raise bad("threads", "a worker_class of yours runs one job per process: threads run herder's own")
    if cfg.worker_command is not None and not cfg.worker_command:
        raise bad("worker_command", "is empty")
    if cfg.http:
        try:
            http_address(cfg.http)
        except ValueError as exc:
            raise bad("http", str(exc)) from None
    if cfg.on_event:
        try:
            if not shlex.split(cfg.on_event):
                raise ValueError("is empty")
        except ValueError as exc:  # unbalanced quotes
            raise bad("on_event", f"is not a command line: {exc}") from None
    if cfg.on_event_url and urlsplit(cfg.on_event_url).scheme not in ("http", "https"):
        raise bad("on_event_url", "must be an http:// or https:// URL")
    for key in ("worker_class", "job_class", "queue_class", "serializer", "rq_config"):
        if getattr(cfg, key) and not is_dotted(getattr(cfg, key)):
            raise bad(key, f"must be a dotted name like package.module.Name, got {getattr(cfg, key)!r}")
    for handler in cfg.exception_handlers:
        if not is_dotted(handler):
            raise bad("exception_handlers", f"must be dotted names like app.errors.report, got {handler!r}")
    if cfg.cron and cfg.cron.endswith(".py") and not os.path.isfile(cfg.cron):
        raise bad("cron", f"no such file: {cfg.cron}")
    if cfg.cron and not cfg.cron.endswith(".py") and not is_dotted(cfg.cron):
        raise bad("cron", f"must be a module like app.cron_config or a .py file, got {cfg.cron!r}")
    if cfg.worker_init and not is_dotted(cfg.worker_init.replace(":", ".", 1)):
        raise bad("worker_init", f"must be module:function like app.hooks.init, got {cfg.worker_init!r}")
    if cfg.django_settings and not is_dotted(cfg.django_settings):
        raise bad("django_settings", f"must be a module like mysite.settings, got {cfg.django_settings!r}")
    for module in cfg.preload:
        if not all(part.isidentifier() for part in module.split(".")):
            raise bad("preload", f"must be module names like app.jobs, got {module!r}")
    if cfg.dequeue_strategy not in ("default", "random", "round_robin"):
        raise bad("dequeue_strategy", f"must be default, random or round_robin, got {cfg.dequeue_strategy!r}")
    for key in ("results_ttl", "worker_ttl", "maintenance_interval"):
        if getattr(cfg, key) is not None and getattr(cfg, key) < 0:
            raise bad(key, f"must not be negative, got {getattr(cfg, key)}")
    if cfg.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise bad("log_level", f"must be DEBUG, INFO, WARNING or ERROR, got {cfg.log_level!r}")
    if cfg.log_format not in ("text", "json"):
        raise bad("log_format", f"must be text or json, got {cfg.log_format!r}")
