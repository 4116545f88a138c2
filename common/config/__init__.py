"""herder's configuration, one module per job (standard library only):

- schema.py: the Config dataclass, every setting with its default, help and reload policy,
  and the names a user writes for it (flag, HERDER_* variable, TOML key);
- values.py: coercion of raw values to their field's type, and validation of the whole;
- layering.py: defaults < RQ's settings module < file < environment < flags, and
  `herder config`'s view of the result;
- reload.py: the file read again, and the plan of what a reload does;
- pools.py: `[pools.NAME]`, each pool a whole Config over the defaults;
- limits.py: the host's default workers limit.

Everything a caller needs is importable from here, `from herder.common.config import Config`.
"""

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
)
from herder.common.exits import EX_CONFIG

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
    "normalize_key",
    "parse_worker_command",
    "redact_setting",
    "redact_url",
    "reload_plan",
    "reload_policy",
    "repeatable",
    "reread",
    "resolve",
    "rq_settings_layer",
]
