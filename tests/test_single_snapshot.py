"""Every view renders the one snapshot: `herder status`, /healthz, /metrics and the dashboard's
JSON are renderers of a HostSnapshot (views/model.py) that one builder makes (views/build.py).

Read from the source (ast), as test_layering.py reads it: a renderer that reaches into the
master, or a second place that builds a snapshot's rows, fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VIEWS = REPO / "supervisor" / "views"
# The renderer, and the function or class that renders.
RENDERERS = {
    "status.py": "build_status",
    "healthz.py": "healthz",
    "prometheus.py": "SnapshotCollector",
    "api.py": "snapshot_json",
}
# What a renderer may import of herder: the snapshot, the rings beside it, the shared bottom.
RENDERER_MAY_IMPORT = (
    "herder.common",
    "herder.supervisor.views.model",
    "herder.supervisor.views.history",
    "herder.supervisor.views.journal",
)
ROWS = {"HostSnapshot", "PoolRow", "WorkerRow", "QueueRow", "ThreadJob", "SchedulerRow", "Health"}
BUILDER = VIEWS / "build.py"


def herder_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module if node.level == 0 else "herder.supervisor.views." + node.module]
        found += [(node.lineno, n) for n in names if n.startswith("herder.")]
    return found


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_a_renderer_imports_only_the_snapshot_never_the_master(name: str) -> None:
    bad = [
        f"{name}:{line} imports {module}"
        for line, module in herder_imports(VIEWS / name)
        if not any(module == ok or module.startswith(ok + ".") for ok in RENDERER_MAY_IMPORT)
    ]
    assert not bad, "a renderer renders a HostSnapshot and reads nothing else of the master: " + str(bad)


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_a_renderer_takes_a_host_snapshot(name: str) -> None:
    tree = ast.parse((VIEWS / name).read_text())
    found = [
        n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == RENDERERS[name]
    ]
    assert found, f"{name} has no {RENDERERS[name]}"
    node = found[0]
    if isinstance(node, ast.ClassDef):  # a collector: its __init__ is handed the newest snapshot
        node = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        args = node.args.args[1:]
    else:
        args = node.args.args
    assert args and args[0].annotation is not None
    assert "HostSnapshot" in ast.unparse(args[0].annotation), f"{name}: {ast.unparse(args[0].annotation)}"


def test_only_the_builder_makes_a_snapshot_or_its_rows() -> None:
    """One builder of every figure, each pool's included: nothing else constructs the rows."""
    makers = []
    for root in ("supervisor", "common", "worker", "watchdog"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path == BUILDER:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ROWS:
                    makers.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.id}(...)")
    assert not makers, makers
    built = {
        node.func.id
        for node in ast.walk(ast.parse(BUILDER.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert built >= ROWS  # the builder itself makes each of them


def test_the_views_are_rendered_from_one_snapshot_the_loop_publishes() -> None:
    """On the fakes: status, /healthz and /metrics agree with the snapshot they are handed."""
    from prometheus_client.parser import text_string_to_metric_families

    from fakes import FakeClock, all_ready, make
    from herder.supervisor.views.healthz import healthz
    from herder.supervisor.views.prometheus import SnapshotCollector, exposition, registry_for
    from herder.supervisor.views.status import build_status

    clock = FakeClock()
    m, _, _ = make(clock, workers=2)
    m.step()
    assert m.views.snapshot is None  # without --http or hooks, nobody reads a published one
    all_ready(m)
    clock.advance(1.0)
    m.step()
    snap = m.take_snapshot()  # as `herder status` has it built
    assert snap.taken_at == clock.monotonic()
    status = build_status(snap)
    code, body = healthz(snap, clock.monotonic())
    text = exposition(registry_for(SnapshotCollector(lambda: snap, clock.monotonic))).decode()
    ready = {
        s.labels["pool"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "herder_workers_ready"
    }
    assert status["pools"]["default"]["ready"] == ready["default"] == body["workers"]["ready"] == 2
    assert code == 200 and status["health"] == "ok"


# The dashboard's JSON, field by field as supervisor/views/API.md gives it.
API_FIELDS = {
    "": "host_id hostname time state health controls pools workers scheduler events advice",
    "health": "ok reasons",
    "pool": "name state autoscale min max wanted running busy queue_length growth oldest_age jobs_per_s "
    "failed_per_s jobs_ok jobs_failed queues",
    "worker": "pool slot pid state job func elapsed timeout jobs_done jobs_failed rss cpu_percent uptime "
    "threads waiting_for waiting_seconds",
    "thread": "thread job func elapsed",
}


def test_the_dashboards_json_keeps_to_its_contract_whatever_the_other_views_need() -> None:
    """The fields status and /metrics read beside the dashboard's stay out of its JSON."""
    from fakes import FakeClock, all_ready, live, make
    from herder.supervisor.views.api import snapshot_json

    clock = FakeClock()
    m, _, _ = make(clock, workers=2)
    m.step()
    all_ready(m)
    next(iter(live(m).values())).busy("job-1", timeout=30.0)
    m.step()
    body = snapshot_json(m.take_snapshot())
    fields = {part: set(names.split()) for part, names in API_FIELDS.items()}
    assert set(body) == fields[""]
    assert set(body["health"]) == fields["health"]
    assert [set(p) for p in body["pools"]] == [fields["pool"]]
    assert [set(w) for w in body["workers"]] == [fields["worker"]] * 2
    assert [set(t) for w in body["workers"] for t in w["threads"]] == [fields["thread"]]
