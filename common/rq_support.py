"""Which rq and redis-py herder supports, and which of its settings need a newer rq.

Standard library only, and rq is never imported here: `herder run` checks the configuration
against the installed rq (from its package metadata) before anything starts, so a setting the
installed rq cannot serve exits 78 with one line naming the rq it needs, instead of a worker
that crashes at run time. pyproject.toml's dependency ranges and README's support table say the
same; CI runs the test suite on each point of that table (.ci/matrix).
"""

from __future__ import annotations

import functools
import re
import sys

# [lowest, highest) of each dependency herder is tested with; pyproject.toml says the same.
SUPPORTED = {
    "rq": ((2, 12), (4,)),
    "redis": ((5, 0), (9,)),
}

# Settings that need a newer rq than the lowest supported: (the version, what it needs there).
# A setting listed here and asked for (not a default) on an older rq is a configuration error.
NEEDS_RQ: dict[str, tuple[tuple[int, ...], str]] = {
    "fast_path": (
        (3, 0),
        "RQ's job-ending hooks (_finalize_success, _finalize_failure) that the fast path records",
    ),
}


def parse_version(text: str) -> tuple[int, ...]:
    """'2.12.0' -> (2, 12, 0); '3.1.0rc1' -> (3, 1, 0): the release numbers only."""
    numbers = []
    for part in text.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(numbers)


def show(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


@functools.cache
def installed(distribution: str) -> tuple[int, ...] | None:
    """The installed version of a distribution, or None: the module's own version if this process
    imported it already (the master has), else from its package metadata, never importing it.
    importlib.metadata is imported only then: it costs the CLI and the watchdog 30 ms and 1.5 MB."""
    module = sys.modules.get(distribution)
    if isinstance(getattr(module, "__version__", None), str):
        return parse_version(module.__version__)  # type: ignore[union-attr]
    from importlib import metadata

    try:
        return parse_version(metadata.version(distribution))
    except metadata.PackageNotFoundError:
        return None


def unsupported_rq_setting(key: str, value: object, rq_version: tuple[int, ...] | None = None) -> str | None:
    """Why `key` set to `value` cannot work on the installed rq, or None. Only settings that turn
    something on are refused: `fast_path = false` is fine anywhere."""
    need = NEEDS_RQ.get(key)
    if need is None or not value:
        return None
    version = installed("rq") if rq_version is None else rq_version
    if version is None or version >= need[0]:
        return None
    return f"needs rq >= {show(need[0])} ({need[1]}); rq {show(version)} is installed"


def support_problems() -> list[str]:
    """Installed dependencies outside the supported ranges, each as one line (none: [])."""
    problems = []
    for name, (low, high) in SUPPORTED.items():
        version = installed(name)
        if version is None:
            problems.append(f"{name} is not installed")
        elif not low <= version < high:
            supported = f"{name}>={show(low)},<{show(high)}"
            problems.append(f"{name} {show(version)} is outside herder's supported range {supported}")
    return problems
