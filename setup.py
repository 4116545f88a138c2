"""herder's version as a build sees it (pyproject.toml's `version` is dynamic; everything else
is there): supervisor/__init__.py's `__version__`, and for a development version the commit it
is built from, `0.2.0.dev0+g1a2b3c4d5e6f`, so a wheel tells its build from another and from a
release. From a git checkout the commit is git's; from an sdist (no .git) it is the one the sdist
was made with (its PKG-INFO); with neither, the bare version. A release number (no `.dev`)
stays as it is. Standard library and setuptools only: the build fetches nothing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def base_version() -> str:
    text = (HERE / "supervisor" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)[1]


def git_commit() -> str | None:
    """HEAD's short hash, or None outside a checkout or without git (herder.supervisor.ctl.version
    asks the same of an editable install's checkout)."""
    if not (HERE / ".git").exists():
        return None
    try:
        r = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def version() -> str:
    base = base_version()
    if ".dev" not in base:
        return base
    commit = git_commit()
    if commit:
        return f"{base}+g{commit}"
    pkg_info = HERE / "PKG-INFO"  # an sdist's: the version it was made with
    if pkg_info.is_file():
        made = re.search(r"^Version: (\S+)$", pkg_info.read_text(), re.MULTILINE)
        if made and made[1].startswith(base + "+"):
            return made[1]
    return base


setup(version=version())
