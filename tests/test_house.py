"""The house rules that keep the master readable, enforced from the source (ast), as
test_layering.py enforces the rooms: a change that breaks one fails here with file and line.

- No Protocol of the master's insides is wider than MAX_MEMBERS: a part that needs more of
  the master takes the master's parts (a pool, the snapshot's Sources), not the master.
- The master's constructor takes a handful of collaborators.
- Every class is a room a reader holds in one sitting: under MAX_CLASS_LINES, or a known
  exception with its reason (below).
- No test module imports another: tests stand on harness.py and fakes.py.
- No state (of a worker, a pool, the master, the watchdog's master) is compared with a
  string: states are enums, compared with their members.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CODE = [REPO / d for d in ("supervisor", "worker", "watchdog", "common")]
MASTER = REPO / "supervisor" / "master.py"
TESTS = REPO / "tests"
MAX_MEMBERS = 8
MAX_CONSTRUCTOR_ARGS = 7  # besides self
# Names a state lives under; a string compared with one of these is a state compared with a string.
STATE_NAMES = {"state", "phase", "master_state", "cull", "kill_kind", "kill_stage", "retire", "kind"}


def sources(roots: list[Path]) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def where(path: Path, node: ast.AST) -> str:
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"{shown}:{getattr(node, 'lineno', 0)}"


def is_protocol(cls: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Name) and b.id == "Protocol")
        or (isinstance(b, ast.Attribute) and b.attr == "Protocol")
        for b in cls.bases
    )


def members(cls: ast.ClassDef) -> set[str]:
    """A class body's attributes (annotated or assigned), methods and properties."""
    out: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("__"):
            out.add(node.name)
    return out


def master_members() -> set[str]:
    """Every member of Master: its methods and properties, and what __init__ sets on self."""
    tree = ast.parse(MASTER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Master")
    found = members(cls)
    for node in ast.walk(cls):
        is_self = (
            isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
        )
        if is_self and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
    return found


def protocols() -> Iterator[tuple[Path, ast.ClassDef]]:
    for path, tree in sources(CODE):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and is_protocol(node):
                yield path, node


@pytest.mark.slow
def test_the_rule_sees_the_masters_protocols() -> None:
    """The check below finds what it looks for: the protocols the master implements."""
    of_master = [cls.name for _, cls in protocols() if members(cls) and members(cls) <= master_members()]
    assert {"Operable", "Reloadable"} <= set(of_master), of_master


@pytest.mark.slow
def test_no_protocol_of_the_masters_insides_is_wider_than_a_handful() -> None:
    """A Protocol every member of which the master has is the master seen through a keyhole:
    a wide one is the master as a hub again."""
    inside = master_members()
    wide = [
        f"{where(path, cls)} {cls.name}: {len(members(cls))} members"
        for path, cls in protocols()
        if members(cls) and members(cls) <= inside and len(members(cls)) > MAX_MEMBERS
    ]
    assert not wide, f"a Protocol of the master's insides has more than {MAX_MEMBERS} members: {wide}"


def test_the_masters_constructor_takes_a_handful_of_collaborators() -> None:
    tree = ast.parse(MASTER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Master")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    args = init.args.args[1:] + init.args.kwonlyargs
    assert len(args) <= MAX_CONSTRUCTOR_ARGS, [a.arg for a in args]


@pytest.mark.slow
def test_no_test_module_imports_another() -> None:
    test_modules = {p.stem for p in TESTS.glob("test_*.py")}
    bad = []
    for path, tree in sources([TESTS]):
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                last = name.split(".")[-1]
                if last in test_modules or last.startswith("test_"):
                    bad.append(f"{where(path, node)} imports {name}")
    assert not bad, "tests import only harness.py, fakes.py and the code: " + "; ".join(bad)


def names_a_state(node: ast.expr) -> bool:
    """`w.state`, `self.phase`, `state`, or `str(w.state)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
        return names_a_state(node.args[0])
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in STATE_NAMES or name.endswith(("_state", "_phase"))


def is_text(node: ast.expr) -> bool:
    """A string literal, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(is_text(e) for e in node.elts)
    return False


def state_string_comparisons(roots: list[Path]) -> list[str]:
    bad = []
    for path, tree in sources(roots):
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(names_a_state(s) for s in sides) and any(is_text(s) for s in sides):
                    bad.append(f"{where(path, node)}: {ast.unparse(node)}")
    return bad


def test_no_state_is_compared_with_a_string() -> None:
    """In the processes' state machines. The renderers (views/) and the CLI (ctl/) read states
    as the snapshot and the wire carry them: strings, by contract (views/API.md)."""
    outside = (REPO / "supervisor" / "views", REPO / "supervisor" / "ctl")
    bad = [
        found
        for found in state_string_comparisons([REPO / "supervisor", REPO / "watchdog"])
        if not any(found.startswith(str(o.relative_to(REPO)) + "/") for o in outside)
    ]
    assert not bad, "compare a state with its enum's member, never with a string: " + "; ".join(bad)


@pytest.mark.parametrize(
    "source",
    ['if w.state == "idle": pass', 'x = str(w.state) in ("idle", "busy")', 'if phase != "stopping": pass'],
)
def test_the_state_rule_catches_a_string_comparison(source: str, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(source)
    assert state_string_comparisons([tmp_path])


def test_the_kill_reasons_metrics_shows_from_the_start_are_the_kill_kinds() -> None:
    """/metrics (a renderer: it reads no state module) lists every kind herder kills for."""
    from herder.supervisor.children.states import KillKind
    from herder.supervisor.views.prometheus import KILL_REASONS

    assert set(KILL_REASONS) == {str(k) for k in KillKind} - {"scheduler", "died"}


# What only the lifecycle does to a supervised child's process: signal it, send it `stop`, reap it.
LIFECYCLE_CALLS = {"signal_group", "send_stop", "reap"}
LIFECYCLE = {"start", "ask_stop", "kill", "escalate", "reap", "exited", "back_off"}


def on_a_process(call: ast.Call) -> bool:
    """`w.proc.reap()`, `proc.signal_group(...)`: a call on a child's process handle."""
    target = call.func.value if isinstance(call.func, ast.Attribute) else None
    return (isinstance(target, ast.Attribute) and target.attr == "proc") or (
        isinstance(target, ast.Name) and target.id == "proc"
    )


def lifecycle_bypasses(path: Path) -> list[str]:
    """Calls in `path` that do the lifecycle's work on a process without it."""
    return [
        f"{where(path, node)}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in LIFECYCLE_CALLS
        and on_a_process(node)
    ]


def lifecycle_calls(path: Path) -> set[str]:
    return {
        node.func.attr
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "lifecycle"
    }


# The rooms that carry a worker's life out: the loop, the spawner, the reaper (the dead) and
# murder (the unresponsive); the scheduler process's keeper on its own.
LIFECYCLE_USERS = {
    "workers": ["master.py", "children/spawner.py", "children/reaper.py", "policy/murder.py"],
    "scheduler": ["children/scheduler.py"],
}


@pytest.mark.parametrize("child", sorted(LIFECYCLE_USERS))
def test_the_workers_and_the_scheduler_live_one_lifecycle(child: str) -> None:
    """The master's workers and RQ's scheduler process are spawned, stopped, killed and reaped
    by supervisor/children/lifecycle.py alone: one graceful rule, one escalation, one reap."""
    paths = [REPO / "supervisor" / name for name in LIFECYCLE_USERS[child]]
    assert set().union(*(lifecycle_calls(p) for p in paths)) == LIFECYCLE, child
    assert not [bypass for p in paths for bypass in lifecycle_bypasses(p)]


def test_the_lifecycle_rule_catches_a_bypass(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("w.proc.reap()\nself.reap()\nlifecycle.reap(w, now)\n")
    assert len(lifecycle_bypasses(tmp_path / "m.py")) == 1


# Where a class is looked at again (see the test's docstring): not a number to meet.
MAX_CLASS_LINES = 400
# The classes past the bound today, (file, class): why each stays for now.
LONG_CLASSES = {
    # One field, its type and its help per setting: read as a table, looked up, not followed.
    ("common/config/schema.py", "Config"): "the settings' schema: a table, not a story",
    # The one thread of the master's Redis writes about jobs and workers (requeues, sweeps,
    # leases, cull tokens), a few lines past the bound: the next to split, by those concerns.
    ("supervisor/redis_side/recovery.py", "RecoveryThread"): "one thread's Redis writes; next to split",
}


def class_lengths(roots: list[Path]) -> dict[tuple[str, str], int]:
    """Every class's lines, from `class` to its last line, docstring and comments included."""
    return {
        (str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name, node.name): (
            (node.end_lineno or node.lineno) - node.lineno + 1
        )
        for path, tree in sources(roots)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


@pytest.mark.slow
def test_every_class_is_a_room_a_reader_holds_in_one_sitting() -> None:
    """A class is a room a reader holds in one sitting: its methods' names on a screen or
    two, its story read from start to end (gunicorn's arbiter; RQ's worker pool does its one
    job in under 300 lines). Past MAX_CLASS_LINES a class is nearly always two jobs, and the
    work belongs to a room that is missing. The bound says where to look again, not a size
    to grow to: a class under it that does two things is still split. In supervisor/,
    worker/, watchdog/ and common/, every class is under it or a known exception with its
    reason; an exception is dropped once its class is short."""
    lengths = class_lengths(CODE)
    long = {key: n for key, n in lengths.items() if n > MAX_CLASS_LINES}
    new = [
        f"{path} {name}: {n} lines"
        for (path, name), n in sorted(long.items())
        if (path, name) not in LONG_CLASSES
    ]
    assert not new, f"classes past {MAX_CLASS_LINES} lines (split by concern, or say why here): {new}"
    stale = [f"{path} {name}" for path, name in LONG_CLASSES if (path, name) not in long]
    assert not stale, f"these are short now (or gone): take them off LONG_CLASSES: {stale}"


def test_the_class_bound_catches_a_long_class(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (tmp_path / "m.py").write_text(f"class Long:\n{body}\n")
    assert class_lengths([tmp_path])["m.py", "Long"] > MAX_CLASS_LINES
