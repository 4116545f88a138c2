"""herder's configuration, one module per job (standard library only):

- schema.py: the Config dataclass, every setting with its default, help and reload policy,
  and the names a user writes for it (flag, HERDER_* variable, TOML key);
- values.py: coercion of raw values to their field's type, and validation of the whole;
- layering.py: defaults < RQ's settings module < file < environment < flags, and
  `herder config`'s view of the result;
- reload.py: the file read again, and the plan of what a reload does;
- pools.py: `[pools.NAME]`, each pool a whole Config over the defaults;
- limits.py: the host's default workers limit;
- prestart.py: the master `herder run` starts before it loads click, handed the validated
  configuration before the exec, and adopted by the watchdog.

Everything a caller needs is importable from here, `from herder.common.config import Config`.

Submodules load on first use (PEP 562): the watchdog and the master read a Config from the
environment at start, and need neither the layering nor the reload code for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from herder.common.config.layering import (
        describe,
        django_layer,
        example_file,
        load_file,
        resolve,
        rq_settings_layer,
    )
    from herder.common.config.limits import default_workers_limit, host_cpus, host_memory
    from herder.common.config.pools import DEFAULT_POOL, POOL_KEYS, all_queues, pool_configs
    from herder.common.config.reload import ReloadPlan, reload_plan, reload_policy, reread
    from herder.common.config.schema import (
        ALIASES,
        APPLY,
        ENV_RESOLVED,
        HELP,
        KEYS,
        RESTART,
        SECRET_KEYS,
        WORKERS,
        Config,
        ConfigError,
        OverLimit,
        env_of,
        flag_of,
        metavar,
        normalize_key,
        repeatable,
    )
    from herder.common.config.values import (
        coerce,
        http_address,
        is_dotted,
        parse_worker_command,
        redact_setting,
        redact_url,
        validate,
    )
    from herder.common.exits import EX_CONFIG

_HOMES = {
    "describe": "herder.common.config.layering",
    "django_layer": "herder.common.config.layering",
    "example_file": "herder.common.config.layering",
    "load_file": "herder.common.config.layering",
    "resolve": "herder.common.config.layering",
    "rq_settings_layer": "herder.common.config.layering",
    "default_workers_limit": "herder.common.config.limits",
    "host_cpus": "herder.common.config.limits",
    "host_memory": "herder.common.config.limits",
    "DEFAULT_POOL": "herder.common.config.pools",
    "POOL_KEYS": "herder.common.config.pools",
    "all_queues": "herder.common.config.pools",
    "pool_configs": "herder.common.config.pools",
    "ReloadPlan": "herder.common.config.reload",
    "reload_plan": "herder.common.config.reload",
    "reload_policy": "herder.common.config.reload",
    "reread": "herder.common.config.reload",
    "ALIASES": "herder.common.config.schema",
    "APPLY": "herder.common.config.schema",
    "ENV_RESOLVED": "herder.common.config.schema",
    "HELP": "herder.common.config.schema",
    "KEYS": "herder.common.config.schema",
    "RESTART": "herder.common.config.schema",
    "SECRET_KEYS": "herder.common.config.schema",
    "WORKERS": "herder.common.config.schema",
    "Config": "herder.common.config.schema",
    "ConfigError": "herder.common.config.schema",
    "OverLimit": "herder.common.config.schema",
    "env_of": "herder.common.config.schema",
    "flag_of": "herder.common.config.schema",
    "metavar": "herder.common.config.schema",
    "normalize_key": "herder.common.config.schema",
    "repeatable": "herder.common.config.schema",
    "coerce": "herder.common.config.values",
    "http_address": "herder.common.config.values",
    "is_dotted": "herder.common.config.values",
    "parse_worker_command": "herder.common.config.values",
    "redact_setting": "herder.common.config.values",
    "redact_url": "herder.common.config.values",
    "validate": "herder.common.config.values",
    "EX_CONFIG": "herder.common.exits",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "ALIASES",
    "APPLY",
    "DEFAULT_POOL",
    "POOL_KEYS",
    "all_queues",
    "pool_configs",
    "ENV_RESOLVED",
    "EX_CONFIG",
    "HELP",
    "KEYS",
    "RESTART",
    "SECRET_KEYS",
    "WORKERS",
    "Config",
    "ConfigError",
    "OverLimit",
    "ReloadPlan",
    "coerce",
    "default_workers_limit",
    "describe",
    "django_layer",
    "env_of",
    "example_file",
    "flag_of",
    "host_cpus",
    "host_memory",
    "http_address",
    "is_dotted",
    "load_file",
    "metavar",
    "normalize_key",
    "parse_worker_command",
    "redact_setting",
    "redact_url",
    "validate",
    "reload_plan",
    "reload_policy",
    "repeatable",
    "reread",
    "resolve",
    "rq_settings_layer",
]
