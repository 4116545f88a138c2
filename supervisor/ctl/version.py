"""`herder --version`: herder's version beside the rq, redis-py and Python it runs on, the three
things a bug report needs. rq's and redis-py's come from their installed metadata: importing them
only to print a version would cost the command a third of a second."""

from __future__ import annotations

import click

from herder.supervisor import __version__


def installed(dist: str) -> str:
    from importlib import metadata  # 40 ms to import: only when --version asks, not on every command

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_line() -> str:
    """e.g. `herder 0.1.0 (rq 3.0.0, redis-py 8.1.0, Python 3.13.1)`."""
    import platform  # its regular expressions cost every command ~10 ms: only for --version

    deps = f"rq {installed('rq')}, redis-py {installed('redis')}, Python {platform.python_version()}"
    return f"herder {__version__} ({deps})"


def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """The --version flag's callback: eager, so it answers before any command runs."""
    if not value or ctx.resilient_parsing:  # resilient: shell completion is parsing, not running
        return
    click.echo(version_line())
    ctx.exit()
