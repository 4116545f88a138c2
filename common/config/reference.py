"""docs/settings.md, made from the schema so the page cannot drift from the code: one row per
setting with its TOML key, flag, HERDER_* variable, default, what a reload does with it (the
field's `reload`, reload.RELOAD_LIMITS) and whether a pool may set it (pools.POOL_KEYS).
Standard library only.

    python -m herder.common.config.reference > docs/settings.md
"""

from __future__ import annotations

import json
import sys
from dataclasses import MISSING, fields

from herder.common.config.pools import POOL_KEYS
from herder.common.config.reload import RELOAD_LIMITS
from herder.common.config.schema import (
    ALIASES,
    APPLY,
    HELP,
    KEYS,
    RESTART,
    WORKERS,
    Config,
    env_of,
    flag_of,
    metavar,
)

COMMAND = "python -m herder.common.config.reference > docs/settings.md"

RELOAD_WORDS = {
    APPLY: "applied at once",
    WORKERS: "rolling restart of the workers",
    RESTART: "refused: restart herder",
}

INTRO = """\
# Settings

Generated from herder's configuration schema (`common/config/schema.py`) by
`{command}`: do not edit it by hand, regenerate it.

Every setting can be given three ways, the later winning: a key in the TOML file (`--config`
or `HERDER_CONFIG`, under `[herder]`), its `HERDER_*` environment variable, and its flag of
`herder run` (`herder config` takes the same flags and prints the effective values with where
each came from; `herder config --example` prints a file with every default). A bad value exits
78 naming the key and its source. RQ's settings module (`--rq-config`) and Django's
`RQ_QUEUES` (`--django-settings`) sit below the file.

- **default**: `-` means unset; the text says what herder does then.
- **reload** (`herder reload` or SIGHUP re-reads the file): *applied at once*; *rolling restart
  of the workers* (only new workers pick the value up, so they are replaced one batch at a time,
  no job interrupted); *refused: restart herder* (read once at start: a reload that changes it
  changes nothing and names the key). Values from the environment or flags are not re-read.
- **pool**: *yes* if a `[pools.NAME]` table may set it for that pool alone
  ([pools](operations.md#pools)); the others are host-wide, under `[herder]` only.
- Repeatable flags (`--queue`, `--path`, `--preload`, `--exception-handler`) take one value each
  time; their variable takes the values separated by spaces, their TOML key a list. A boolean
  has a `--no-` form.

| key | flag | environment | default | reload | pool | what |
| --- | --- | --- | --- | --- | --- | --- |
"""


def toml_value(value: object) -> str:
    """A default as it would be written in the TOML file; `-` for unset."""
    if value is None or value == "":
        return "-"
    return json.dumps(value)


def defaults() -> dict[str, object]:
    """Each key's default from the dataclass itself (not Config(), whose help and derived
    values may depend on the host)."""
    out: dict[str, object] = {}
    for f in fields(Config):
        if f.name in KEYS:
            out[f.name] = f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
    return out


def flag_cell(key: str, default: object) -> str:
    flag = flag_of(key)
    if isinstance(default, bool):
        return f"`{flag}` / `--no-{flag[2:]}`"
    repeat = " (repeatable)" if key in ALIASES.values() else ""
    kind = f" {metavar(key)}" if metavar(key) else ""
    return f"`{flag}`{kind}{repeat}"


def key_cell(key: str) -> str:
    also = [alias for alias, name in ALIASES.items() if name == key]
    return f"`{key}`" + (f" (or `{also[0]}`)" if also else "")


def reload_cell(key: str) -> str:
    policy = next(f.metadata["reload"] for f in fields(Config) if f.name == key)
    words = RELOAD_WORDS[policy]
    return f"{words}: {RELOAD_LIMITS[key]}" if key in RELOAD_LIMITS else words


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole of docs/settings.md."""
    lines = [INTRO.format(command=COMMAND)]
    for key, default in defaults().items():
        row = [
            key_cell(key),
            flag_cell(key, default),
            f"`{env_of(key)}`",
            f"`{toml_value(default)}`" if toml_value(default) != "-" else "-",
            reload_cell(key),
            "yes" if key in POOL_KEYS else "no",
            HELP[key],
        ]
        lines.append("| " + " | ".join(cell(c) for c in row) + " |\n")
    return "".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
