"""`herder --version`: herder's version beside the rq, redis-py and Python it runs on, the three
things a bug report needs. rq's and redis-py's come from their installed metadata: importing them
only to print a version would cost the command a third of a second.

herder's own is this build's: a development version carries the commit it was built from
(setup.py puts it in the wheel's metadata), or, run from a git checkout (an editable install), the
checkout's commit now; a release is its number alone."""

from __future__ import annotations

from pathlib import Path

import click

from herder.supervisor import __version__


def installed(dist: str) -> str:
    from importlib import metadata  # 40 ms to import: only when --version asks, not on every command

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def checkout_commit(checkout: Path) -> str | None:
    """HEAD's short hash of the checkout herder runs from, or None (setup.py asks the same)."""
    if not (checkout / ".git").exists():
        return None
    import subprocess  # only for --version

    try:
        argv = ["git", "-C", str(checkout), "rev-parse", "--short=12", "HEAD"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def herder_version() -> str:
    """e.g. 0.2.0.dev0+g1a2b3c4d5e6f from a build of a checkout, 0.2.0 for the release."""
    if ".dev" in __version__:
        commit = checkout_commit(Path(__file__).resolve().parents[2])  # the checkout, if run from one
        if commit:
            return f"{__version__}+g{commit}"
    built = installed("herder")  # the wheel's metadata: the commit it was built from
    return built if built.startswith(__version__ + "+") else __version__


def version_line() -> str:
    """e.g. `herder 0.2.0.dev0+g1a2b3c4d5e6f (rq 3.0.0, redis-py 8.1.0, Python 3.13.1)`."""
    import platform  # its regular expressions cost every command ~10 ms: only for --version

    deps = f"rq {installed('rq')}, redis-py {installed('redis')}, Python {platform.python_version()}"
    return f"herder {herder_version()} ({deps})"


def print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """The --version flag's callback: eager, so it answers before any command runs."""
    if not value or ctx.resilient_parsing:  # resilient: shell completion is parsing, not running
        return
    click.echo(version_line())
    ctx.exit()
