"""Which herder is measured: a snapshot of its source, a digest of it, and its git state.

The repository keeps supervisor/, worker/ and watchdog/ at the top; installed, they are
herder.supervisor, herder.worker, herder.watchdog and herder.common (common/),
under the namespace package `herder`. The layout is read from pyproject.toml's
[tool.setuptools.package-dir], so the snapshot follows it when it changes.
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

from bench_base import REPO, BenchError, say
from bench_procs import Processes, child_env

NAMESPACE = "herder"


def layout(repo: Path = REPO) -> dict[str, Path]:
    """Installed package -> its source folder, e.g. "herder.common" -> <repo>/common."""
    try:
        config = tomllib.loads((repo / "pyproject.toml").read_text())
        package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise BenchError(f"no [tool.setuptools.package-dir] in {repo / 'pyproject.toml'}: {exc}") from exc
    found = {pkg: repo / src for pkg, src in package_dir.items() if pkg.startswith(NAMESPACE + ".")}
    if not found:
        raise BenchError(f"no {NAMESPACE}.* packages in {repo / 'pyproject.toml'}'s package-dir")
    return found


def source_dirs(repo: Path = REPO) -> list[str]:
    """The top-level folders herder's source lives in (supervisor, worker, watchdog)."""
    tops = [src.relative_to(repo).parts[0] for src in layout(repo).values()]
    return list(dict.fromkeys(tops))


def _nested(src: Path, sources: list[Path]) -> list[Path]:
    """The source folders of other packages inside `src` (none today; a package folder nested in another's):
    installed elsewhere, so not part of `src`'s package."""
    return [s for s in sources if s != src and s.is_relative_to(src)]


def herder_files(root: Path = REPO) -> dict[str, Path]:
    """herder's .py files by installed path ("herder/common/config.py"), in the repository
    (`root` holds pyproject.toml) or in a snapshot (`root` holds herder/)."""
    if not (root / "pyproject.toml").exists():
        return {str(f.relative_to(root)): f for f in (root / NAMESPACE).rglob("*.py")}
    files = {}
    packages = layout(root)
    for pkg, src in packages.items():
        inner = _nested(src, list(packages.values()))
        for f in src.rglob("*.py"):
            if not any(f.is_relative_to(s) for s in inner):
                files[str(Path(*pkg.split("."), f.relative_to(src)))] = f
    return files


def herder_digest(root: Path = REPO) -> str:
    """A digest of herder's source, to notice the code changing under a run; the same for
    the repository and a faithful snapshot of it."""
    h = hashlib.sha256()
    for name, f in sorted(herder_files(root).items()):
        with contextlib.suppress(OSError):
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def snapshot_herder(dest: Path) -> Path:
    """Copy herder's packages as they are installed (dest/herder/supervisor, dest/herder/common,
    ...; no herder/__init__.py, as `herder` is a namespace), so that edits to the working tree
    during a run (herder is installed in editable mode) cannot change the code being measured.
    The copy comes first on PYTHONPATH for herder's processes, ahead of the editable install's
    finder, which Python consults only after the path."""
    packages = layout()
    for pkg, src in packages.items():
        inner = _nested(src, list(packages.values()))

        def ignore(folder: str, names: list[str], inner: list[Path] = inner) -> set[str]:
            return {n for n in names if n == "__pycache__" or Path(folder, n) in inner}

        shutil.copytree(src, dest.joinpath(*pkg.split(".")), ignore=ignore)
    # Byte-compiled as pip compiles an installed wheel: with PYTHONDONTWRITEBYTECODE set (as
    # on some machines) every herder process would otherwise compile its modules at each
    # start, a cost rq's and supervisord's installed packages never pay.
    compileall.compile_dir(str(dest), quiet=1)
    env = child_env()
    env["PYTHONPATH"] = str(dest)
    # Import herder's entry points (by their public names only: the modules inside
    # herder.supervisor may be rearranged), then check where every herder module came from.
    probe = (
        "import sys, herder.supervisor.ctl.cli, herder.watchdog, herder.worker\n"
        "for name, m in sorted(sys.modules.items()):\n"
        "    if name.startswith('herder.') and getattr(m, '__file__', None):\n"
        "        print(m.__file__)\n"
    )
    where = subprocess.run(
        [sys.executable, "-P", "-c", probe], env=env, capture_output=True, text=True, check=False
    )
    files = where.stdout.splitlines()
    if where.returncode != 0 or not files:
        raise BenchError(f"the snapshot of herder in {dest} does not import: {where.stderr.strip()[-500:]}")
    strays = [f for f in files if not Path(f).is_relative_to(dest)]
    if strays:
        raise BenchError(f"herder imports from outside its snapshot in {dest}: {', '.join(strays[:5])}")
    return dest


def git_state(repo: Path = REPO) -> str:
    """The commit, and whether herder's own source differs from it."""

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True
        ).stdout.strip()

    with contextlib.suppress(OSError, subprocess.CalledProcessError, BenchError):
        dirty = git("status", "--porcelain", "--", *source_dirs(repo))
        return git("rev-parse", "--short", "HEAD") + (" (herder's code modified)" if dirty else "")
    return "unknown"


def run_each(
    keys: list[str], tmp: Path, run_one: Callable[[str, dict[str, str], Processes], dict]
) -> dict[str, dict] | None:
    """Each contender in turn (herder's from a snapshot of its source, so edits during the run
    change nothing), every process ended after: {key: what run_one measured}, or None when one
    failed (said, with where its logs are)."""
    procs = Processes()
    results: dict[str, dict] = {}
    try:
        herder_src = snapshot_herder(tmp / "herder-src")
        say(f"herder from a snapshot of its source (digest {herder_digest(herder_src)})")
        for key in keys:
            env = child_env()
            if key != "rq":
                env["PYTHONPATH"] = str(herder_src)
            results[key] = run_one(key, env, procs)
            say(f"{key}: {results[key]}")
    except BenchError as exc:
        say(f"error: {exc}; logs kept in {tmp}")
        return None
    finally:
        procs.kill_all(spare=set())
    return results


def scratch(prefix: str, module: str, source: str) -> Path:
    """A scratch folder for one scenario, its job code in `jobs/` (every contender's --path),
    with this process the subreaper of whatever the contenders leave behind."""
    from bench_procs import become_subreaper

    become_subreaper()
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    (tmp / "jobs").mkdir()
    (tmp / "jobs" / module).write_text(source)
    return tmp
