"""herder's release as a packager gets it: the sdist and the wheel `python -m build` makes pass
`twine check --strict`, carry LICENSE and the metadata PyPI shows, and the sdist alone is enough
to install herder and to run its unit tests.

Everything happens offline, from the wheels scripts/setup caches in $VENV/peer-wheels: the build's
isolated environment, the fresh venv and what the unit tests import all come from there. The
release is built once for the module (about 15 s); the slow test then installs the sdist and runs
the unit tests from its own unpacked tree (about a minute of the total).
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

from harness import HERDER, TESTS, clean_env
from harness import run_clean as run
from herder.supervisor import __version__
from herder.supervisor.ctl.version import checkout_commit

REPO = TESTS.parent
PEER_WHEELS = Path(sys.prefix) / "peer-wheels"
# The folders a packager runs, reads and ships from the sdist: every file of each must be in it.
SDIST_FOLDERS = ("tests", "docs", "deploy", "examples", "scripts", ".ci")  # .ci/matrix: tests read it
SDIST_FILES = ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "MANIFEST.in")
# pyproject's stand-in for the repository's address, until it has one.
URL_BASE = "https://REPOSITORY-URL-PLACEHOLDER.invalid/"
# What the unit tests import beyond herder's own dependencies: scripts/setup caches the same.
UNIT_TEST_NEEDS = ("pytest", "hypothesis", "pyyaml", "packaging", "kubernetes-validate")
VERSION_LINE = re.compile(r"herder (\S+) \(rq (\S+), redis-py (\S+), Python (\S+)\)")


def source_copy(dest: Path) -> Path:
    """The checkout as a release is made from it: no build/, egg-info, venv or dot folder of an
    earlier build or of ours (and nothing the build writes lands in the checkout)."""

    def leave_out(folder: str, names: list[str]) -> set[str]:
        return {
            n
            for n in names
            if (n.startswith(".") and n != ".ci")
            or n in ("__pycache__", "build", "dist", "state")
            or n.endswith(".egg-info")
            or (Path(folder, n) / "pyvenv.cfg").exists()
        }

    shutil.copytree(REPO, dest, ignore=leave_out)
    return dest


@dataclass
class Release:
    src: Path  # what it was built from
    sdist: Path
    wheel: Path

    def sdist_names(self) -> list[str]:
        """The sdist's files, relative to its top folder (herder-VERSION/)."""
        with tarfile.open(self.sdist) as tar:
            return [m.name.partition("/")[2] for m in tar.getmembers() if m.isfile()]

    def wheel_metadata(self) -> Message:
        with zipfile.ZipFile(self.wheel) as whl:
            return Parser().parsestr(whl.read(f"herder-{__version__}.dist-info/METADATA").decode())


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    if not (PEER_WHEELS / ".stamp").is_file():
        pytest.fail(
            f"no wheel cache at {PEER_WHEELS}: run scripts/setup with the test extra "
            '(HERDER_EXTRAS="[test]"; scripts/test does it), which downloads the wheels this test installs'
        )
    root = tmp_path_factory.mktemp("release")
    src = source_copy(root / "src")
    # Build isolation, offline: the isolated environment installs setuptools from the cache only.
    # `python -m build` makes the sdist, then the wheel from the sdist: the sdist must be enough.
    run(sys.executable, "-m", "build", "--outdir", root / "dist", src, cwd=root,
        PIP_NO_INDEX="1", PIP_FIND_LINKS=str(PEER_WHEELS))  # fmt: skip
    (sdist,) = (root / "dist").glob("herder-*.tar.gz")
    (wheel,) = (root / "dist").glob("herder-*.whl")
    return Release(src, sdist, wheel)


def installed_version_line(herder: str | Path, cwd: Path) -> re.Match[str]:
    out = run(herder, "--version", cwd=cwd).stdout.strip()
    m = VERSION_LINE.fullmatch(out)
    assert m, f"herder --version said {out!r}"
    return m


@pytest.mark.slow
def test_version_names_herder_rq_redis_py_and_python(tmp_path: Path) -> None:
    """From this environment (a checkout's editable install, or the sdist's venv below): from a
    checkout, a development version names the checkout's commit."""
    m = installed_version_line(HERDER, tmp_path)
    python = platform.python_version()
    commit = checkout_commit(REPO) if ".dev" in __version__ else None
    herder = f"{__version__}+g{commit}" if commit else __version__
    assert m.groups() == (herder, metadata.version("rq"), metadata.version("redis"), python)
    # Cheap: neither rq nor redis-py is imported to print it.
    probe = "from herder.supervisor.ctl.cli import cli; cli(['--version'], prog_name='herder')"
    argv = [sys.executable, "-X", "importtime", "-c", probe]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=30)
    imported = {line.rpartition("|")[2].strip() for line in r.stderr.splitlines()}
    assert r.returncode == 0 and imported, r.stderr
    assert not imported & {"rq", "redis"}, "herder --version imports rq or redis-py"


@pytest.mark.slow
def test_archives_pass_twine_and_carry_license_and_metadata(release: Release) -> None:
    twine = (sys.executable, "-m", "twine", "check", "--strict")
    run(*twine, release.sdist, release.wheel, cwd=release.src.parent)
    license_text = (REPO / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "Copyright (c) 2026 the herder authors" in license_text
    with tarfile.open(release.sdist) as tar:
        assert tar.extractfile(f"herder-{__version__}/LICENSE").read().decode() == license_text
    with zipfile.ZipFile(release.wheel) as whl:
        assert whl.read(f"herder-{__version__}.dist-info/licenses/LICENSE").decode() == license_text

    meta = release.wheel_metadata()
    assert meta["Version"] == __version__
    assert meta.get_all("License-File") == ["LICENSE"]
    from trove_classifiers import classifiers as known  # here: the sdist's own unit-test run lacks it

    classifiers = meta.get_all("Classifier")
    assert "License :: OSI Approved :: MIT License" in classifiers
    assert not set(classifiers) - known, f"not trove classifiers: {set(classifiers) - known}"
    # Every project URL names a file of the repository, and the sdist carries it.
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Changelog"} <= urls.keys(), urls
    in_sdist = set(release.sdist_names())
    for label, url in urls.items():
        assert url.startswith(URL_BASE) and url.removeprefix(URL_BASE) in in_sdist, (label, url)


@pytest.mark.slow
def test_sdist_carries_tests_docs_deploy_examples_and_scripts(release: Release) -> None:
    names = set(release.sdist_names())
    assert not [f for f in SDIST_FILES if f not in names]
    for folder in SDIST_FOLDERS:
        files = {str(f.relative_to(release.src)) for f in (release.src / folder).rglob("*") if f.is_file()}
        assert files, folder
        missing = sorted(f for f in files if "__pycache__" not in f and f not in names)
        assert not missing, f"the sdist lacks {missing}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


@pytest.mark.slow
def test_sdist_installs_offline_and_its_unit_tests_pass(release: Release, tmp_path: Path) -> None:
    """A packager's path: the sdist alone, a fresh venv, nothing from the network."""
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    # --no-compile: the unit tests compile what they import; no need to byte-compile every file first.
    pip = (venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", "--no-index")
    pip += ("--find-links", PEER_WHEELS)
    run(*pip, release.sdist, *UNIT_TEST_NEEDS, cwd=tmp_path)
    m = installed_version_line(venv / "bin" / "herder", tmp_path)
    assert m[1] == __version__
    with tarfile.open(release.sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    tree = tmp_path / f"herder-{__version__}"
    # The venv's pytest, from the sdist's tree: its conftest, its pyproject's markers, and the
    # herder installed from the sdist (the tree has no `herder` package of its own to shadow it).
    r = subprocess.run(
        [venv / "bin" / "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tree,
        timeout=600,
    )
    assert r.returncode == 0, f"the unit tests failed from the sdist:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert re.search(r"\d+ passed", r.stdout), r.stdout[-2000:]
