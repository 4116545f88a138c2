"""scripts/bench/run is one program: one argparse parser, a subcommand per scenario, and one module
(bench_commands.py) that spells out how a contender is started. No benchmark runs here: the
--help of each scenario, a usage error, and the bench's source read as Python."""

from __future__ import annotations

import argparse
import ast
import importlib.machinery
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench"
RUN = BENCH / "run"
COMMANDS = "bench_commands.py"  # the one module that builds the contenders' command lines
SCENARIOS = ("spike", "traces", "recycle", "network", "threads", "dashboard", "soak", "launch", "rolling")


def bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(RUN), *argv], capture_output=True, text=True, timeout=120)


def sources() -> dict[str, ast.Module]:
    """Every Python file of scripts/bench (run included), parsed."""
    files = [RUN, *sorted(BENCH.glob("*.py"))]
    return {f.name: ast.parse(f.read_text(), str(f)) for f in files}


def strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@pytest.mark.slow
def test_the_top_level_help_lists_every_scenario_with_its_line() -> None:
    r = bench("--help")
    assert r.returncode == 0, r.stderr
    assert "--markdown" in r.stdout  # the main comparison's options, at the top
    for name in SCENARIOS:
        assert re.search(rf"^ +{name} +\S", r.stdout, re.M), f"{name} has no line of its own:\n{r.stdout}"


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_has_its_help(scenario: str) -> None:
    r = bench(scenario, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: scripts/bench/run {scenario} "), r.stdout[:200]


@pytest.mark.slow
def test_a_usage_error_of_the_main_comparison_exits_2_before_anything_starts() -> None:
    r = bench("--contenders", "herder,nobody")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unknown nobody" in r.stderr


def test_the_bench_has_one_argument_parser_in_run() -> None:
    made = [
        name
        for name, tree in sources().items()
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == "ArgumentParser"
    ]
    assert made == ["run"]


def test_every_scenario_is_a_module_with_a_summary_options_and_a_run() -> None:
    trees = sources()
    for name in SCENARIOS:
        defined = {
            getattr(n, "name", None) or getattr(n.targets[0], "id", None)
            for n in trees[f"bench_{name}.py"].body
            if isinstance(n, ast.FunctionDef | ast.Assign)
        }
        assert {"SUMMARY", "add_arguments", "run"} <= defined, name
        assert "main" not in defined, f"bench_{name}.py: its own main() left over"


def test_contenders_command_lines_are_built_only_in_bench_commands() -> None:
    # What only a command line of herder, rq's pool or supervisord holds, or herder's master's:
    # a module with one of these builds (or recognises) a contender itself.
    markers = {"--redis-url", "worker-pool", "--num-workers", "--with-scheduler", "[program:rqworker]"}
    markers.add("herder.supervisor")  # how a pool's master is told apart
    for name, tree in sources().items():
        if name == COMMANDS:
            assert markers <= strings(tree), "bench_commands.py no longer holds every marker"
            continue
        assert not markers & strings(tree), f"{name} spells out a contender: {markers & strings(tree)}"
        # `bindir / "herder"`, `Path(...).with_name("rq")`: a command found by itself.
        for n in ast.walk(tree):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
                assert not (isinstance(n.right, ast.Constant) and n.right.value in ("herder", "rq")), name
            if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "with_name":
                assert not any(isinstance(a, ast.Constant) and a.value in ("herder", "rq") for a in n.args), (
                    name
                )


def test_no_issue_numbers_in_the_bench() -> None:
    for f in [RUN, *BENCH.glob("*.py")]:
        found = re.findall(r"\bissues? \d+", f.read_text(), re.I)
        assert not found, f"{f.name}: {found}"


def parser() -> argparse.ArgumentParser:
    """scripts/bench/run's one parser, built in process (run is a script without .py)."""
    sys.path.insert(0, str(BENCH))
    loader = importlib.machinery.SourceFileLoader("bench_run", str(RUN))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("bench_run", loader))
    loader.exec_module(module)
    return module.build_parser()[0]


def test_rolling_takes_its_options_with_their_defaults() -> None:
    args = parser().parse_args(["rolling"])
    bench_rolling = args.module
    assert bench_rolling.__name__ == "bench_rolling"
    assert (args.workers, args.job_s, args.runs, args.markdown) == ("256", 1.0, 1, None)
    assert bench_rolling.sizes(args.workers) == [256]
    args = parser().parse_args(["rolling", "--workers", "16,32", "--job-s", "0.02", "--runs", "3",
                                "--markdown", "/tmp/r.md"])  # fmt: skip
    assert (bench_rolling.sizes(args.workers), args.job_s, args.runs, args.markdown) == (
        [16, 32],
        0.02,
        3,
        "/tmp/r.md",
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "16,x", ""])
def test_rolling_refuses_a_bad_fleet_size_before_anything_starts(workers: str) -> None:
    r = bench("rolling", "--workers", workers)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--workers: a positive number or a comma list" in r.stderr


def test_a_rolling_restart_of_less_than_a_second_still_has_its_jobs_per_second() -> None:
    """A tiny fleet may be replaced within a second: its one figure is the jobs/s throughout,
    not an empty list (the scenario's own test saw one)."""
    bench_rolling = parser().parse_args(["rolling"]).module
    asked = 100.0
    looks = [
        bench_rolling.Look(asked + t, frozenset({1}), frozenset({1}), frozenset({1}), done, 5, 0.01)
        for t, done in [(0.1, 10), (0.4, 40), (0.7, 70)]
    ]
    res = bench_rolling.Result(workers=1, run=1, load_before=0.0)
    bench_rolling.judge(res, looks, asked, asked + 0.8)
    assert res.per_second == [100.0] and res.worst_second == 100.0
    one = frozenset({1})
    looks.append(bench_rolling.Look(asked + 2.5, one, one, one, 250, 5, 0.01))
    res = bench_rolling.Result(workers=1, run=1, load_before=0.0)
    bench_rolling.judge(res, looks, asked, asked + 3.0)
    assert len(res.per_second) == 2  # whole seconds only, once there is one
