"""The scaling table's rounds (scripts/bench/bench_scaling.py): herder runs each size a few
times, every size once a round, and a target between two sizes is judged on each round's ratio,
run back to back, and the median of those. Pure: no benchmark runs here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))

from bench_contenders import BY_KEY  # noqa: E402
from bench_report import Medians, target_section  # noqa: E402
from bench_scaling import median_run  # noqa: E402


def run(turn: int, cpu_ms: float, ready: float = 1.0, idle: float = 0.005, threads: int = 6) -> dict:
    return {
        "round": turn,
        "sup_cpu_per_1000": cpu_ms / 1000,
        "ready": ready,
        "jobs_per_s": 1000.0,
        "sup_idle_cpu": idle,
        "threads_idle": threads,
        "threads_peak": threads,
        "memory": {"cpu": cpu_ms},
    }


def test_a_sizes_row_is_the_median_of_each_figure_and_keeps_every_run() -> None:
    runs = [run(1, 30, ready=2.0, threads=6), run(2, 20, ready=1.0, threads=7), run(3, 40, ready=3.0)]
    row = median_run(runs)
    assert row["sup_cpu_per_1000"] == pytest.approx(0.030) and row["ready"] == 2.0
    assert row["threads_peak"] == 7  # the most seen, not the median
    assert row["memory"] == {"cpu": 30}  # the rest: the run of the median CPU
    assert row["runs"] == runs


def targets(by_size: dict[int, list[dict]]) -> str:
    scaling = {"herder": {size: median_run(rs) for size, rs in by_size.items()}}
    results = {"scaling": scaling, "throughput": {}, "idle": {}, "crash": {}}  # the other parts skipped
    args = argparse.Namespace(scale_sizes=sorted(by_size), scale_runs=3)
    return "\n".join(target_section(args, [BY_KEY["herder"]], Medians(results)))


def row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {start}"))


def test_a_ratio_target_is_judged_on_each_rounds_ratio_not_on_the_medians_of_each_size() -> None:
    # Round 2 ran on a slow machine at both sizes: its ratio is fine though both figures are high.
    text = targets({
        4: [run(1, 20), run(2, 40), run(3, 21)],
        64: [run(1, 22), run(2, 44), run(3, 23)],
        256: [run(1, 24), run(2, 48), run(3, 40)],
    })  # fmt: skip
    at_256 = row(text, "master CPU per job at 256 workers within 1.3x")
    assert "1.20x, the median of 3 rounds: 24 ms vs 20 ms, 48 ms vs 40 ms, 40 ms vs 21 ms" in at_256
    assert at_256.endswith("| yes |")
    # The medians of each size alone (40 ms vs 21 ms) would have said 1.9x: no.


def test_a_target_missed_in_two_rounds_of_three_is_not_met() -> None:
    text = targets({
        4: [run(1, 20), run(2, 20), run(3, 20)],
        64: [run(1, 21), run(2, 21), run(3, 21)],
        256: [run(1, 30), run(2, 27), run(3, 20)],
    })  # fmt: skip
    assert row(text, "master CPU per job at 256 workers within 1.3x").endswith("| **no** |")
    idle = row(text, "master idle under 1% of a core")
    assert "0.5% at 256 workers (median of 3: 0.5%, 0.5%, 0.5%)" in idle and idle.endswith("| yes |")
