"""The map of the rooms in docs/design.md, enforced: which part of herder may import what.

Read from the source (ast), so it runs in milliseconds and a new import that breaks the
layering fails here, with the file and the line, before anyone has to notice.
"""

from __future__ import annotations

import ast
import graphlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Where each installed package's source lives (pyproject.toml's package-dir).
SOURCES = {
    "herder.common": REPO / "common",
    "herder.supervisor": REPO / "supervisor",
    "herder.worker": REPO / "worker",
    "herder.watchdog": REPO / "watchdog",
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

# room -> what it may import besides the standard library and itself
ALLOWED: dict[str, set[str]] = {
    "herder.common": set(),
    # The one module of the bottom room that knows Redis: how every process connects (Sentinel
    # included). The watchdog never imports it (test below).
    "herder.common.redis_connect": {"redis"},
    # The one seam to RQ's internals, for the master and the workers (the watchdog never imports it).
    "herder.common.rq_seam": {"herder.common", "redis", "rq"},
    "herder.watchdog": {"herder.common"},
    # django: worker/hooks.py sets Django up when the user names a settings module.
    # setproctitle: the template and what it forks name themselves for ps.
    "herder.worker": {"herder.common", "rq", "redis", "django", "setproctitle"},
    "herder.supervisor.redis_side": {"herder.common", "rq", "redis"},
    "herder.supervisor": {"herder.common", "herder.supervisor", "rq", "redis", "psutil", "prometheus_client"},
    "herder.supervisor.ctl": {
        "herder.common",
        "herder.supervisor",
        "herder.watchdog.embedded_redis",
        "click",
    },
}


# The one crossing between rooms: the master forks its first template from itself, and the
# child it forks (never the master) imports the template's code and becomes it.
FORKED_CHILD = {("herder.supervisor.children.forkserver", "herder.worker.template")}


def modules() -> list[tuple[str, Path]]:
    out = []
    for package, root in SOURCES.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([package, *parts]), path))
    return out


def room_of(module: str) -> str:
    return max((room for room in ALLOWED if module == room or module.startswith(room + ".")), key=len)


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def allowed(room: str, name: str) -> bool:
    if name.split(".")[0] in STDLIB or name == room or name.startswith(room + "."):
        return True
    return any(name == ok or name.startswith(ok + ".") for ok in ALLOWED[room])


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_each_room_imports_only_what_the_map_allows(module: str, path: Path) -> None:
    room = room_of(module)
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for line, name in imports(path)
        if not allowed(room, name) and (module, name) not in FORKED_CHILD
    ]
    assert not bad, f"{room} may import only the standard library and {sorted(ALLOWED[room])}: {bad}"


def test_the_master_process_never_imports_the_operator_side_or_other_processes() -> None:
    for module, path in modules():
        if room_of(module) in ("herder.supervisor", "herder.supervisor.redis_side"):
            names = [name for _, name in imports(path) if (module, name) not in FORKED_CHILD]
            assert not [
                n
                for n in names
                if n.startswith(("herder.supervisor.ctl", "herder.watchdog", "herder.worker"))
            ]


# Inside the master, the folders point one way: the loop (master.py, composed by __main__.py,
# woken by events.py) drives the children, the policy, the views and the control surface; the
# control surface serves the views and speaks to the pools; nothing below imports the loop, and
# the views never import the control surface that serves them (views/publish.py's `Outlet`).
LOOP = ("herder.supervisor.master", "herder.supervisor.__main__", "herder.supervisor.events")
CONTROL = ("herder.supervisor.control",)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "herder.supervisor.children": LOOP + CONTROL,
    "herder.supervisor.policy": LOOP + CONTROL,
    "herder.supervisor.views": LOOP + CONTROL,
    "herder.supervisor.redis_side": LOOP + CONTROL,
    "herder.supervisor.control": LOOP,
}


def test_the_masters_folders_point_one_way() -> None:
    known = {m for m, _ in modules()}
    bad = []
    for module, path in modules():
        folder = next((f for f in FORBIDDEN if module.startswith(f + ".")), None)
        if folder is None:
            continue
        for name in herder_imports(module, path, known):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[folder]):
                bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert not bad, bad


def test_every_module_of_the_master_lives_in_a_folder_but_the_loop() -> None:
    """supervisor/'s top holds the loop alone; every other module is in the folder of its job."""
    top = sorted(p.name for p in (REPO / "supervisor").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "events.py", "master.py", "uplink.py"], top


def test_the_watchdog_never_imports_redis_even_through_the_bottom_room() -> None:
    for module, path in modules():
        if room_of(module) == "herder.watchdog":
            names = [name for _, name in imports(path)]
            assert not {"herder.common.redis_connect", "herder.common.rq_seam"} & set(names), path


def test_nothing_imports_the_top_level_names_herder_installs_under() -> None:
    """`supervisor`, `worker` and `watchdog` are other projects' packages."""
    for _, path in modules():
        names = [name for _, name in imports(path)]
        assert not [n for n in names if n.split(".")[0] in ("supervisor", "worker", "watchdog")], path


def herder_imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The herder modules `module` imports anywhere in its file (inside functions and under
    TYPE_CHECKING too): `from herder.a import b` counts as herder.a.b when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("herder"):
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                      for a in node.names}  # fmt: skip
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("herder")}
    return {name for name in found if name in known and name != module}


def test_no_import_cycle_between_herders_modules() -> None:
    """Each module can be read knowing only what it imports: no two modules import each other,
    not even lazily or for type hints (a Protocol of what a module uses breaks such a cycle)."""
    known = {m for m, _ in modules()}
    graph = {m: herder_imports(m, path, known) for m, path in modules()}
    cycle: list[str] = []
    try:
        order = tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        cycle, order = exc.args[1], ()
    assert not cycle, f"an import cycle: {' -> '.join(cycle)}"
    assert set(order) == set(graph)  # every module placed: the graph was read whole


@pytest.mark.slow
def test_the_watchdog_process_loads_only_the_standard_library_and_the_shared_folder() -> None:
    """What the watchdog has in memory once its modules are imported, read from a real
    interpreter: no redis, rq, psutil or click, and nothing of the master or the worker."""
    import subprocess

    probe = (
        "import sys, herder.watchdog.__main__, herder.watchdog.entry;print('\\n'.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    foreign = [
        m
        for m in loaded
        if m.split(".")[0] not in STDLIB
        and not m.startswith(("herder.common", "herder.watchdog"))
        and m not in ("__main__", "herder", "_distutils_hack")
        and not m.startswith("__editable__")  # the editable install's path finder
    ]
    assert not foreign, f"the watchdog loads more than the stdlib and herder.common: {foreign}"
    assert "herder.common.redis_connect" not in loaded and "herder.common.rq_seam" not in loaded
