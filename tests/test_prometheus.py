"""deploy/prometheus: the alerting and recording rules checked and unit-tested with promtool,
and a real Prometheus (Debian's) scraping a real herder with the shipped rules file loaded:
every documented series is there with its labels, every dashboard query and every rule
returns data, and a job that keeps killing its worker turns the crash-loop alert on."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness import free_port, wait_for

ROOT = Path(__file__).parent.parent
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "herder-rules.yaml"
RULE_TESTS = RULES_DIR / "herder-rules.test.yaml"
DASHBOARD = ROOT / "examples" / "grafana-dashboard.json"
# What a Grafana variable stands for when the dashboard's queries run here: every instance, and
# windows long enough for two scrapes at 1 s.
GRAFANA_VARIABLES = {"instance": ".*", "__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


def tool(name: str) -> str:
    """The binary's path; fails under CI (scripts/setup installs it), skips elsewhere."""
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing: scripts/setup installs Debian's prometheus with the test extra")
    pytest.skip(f"{name} not installed (Debian: apt-get install --no-install-recommends prometheus)")


def promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def rule_groups() -> list[dict[str, Any]]:
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


# ---- promtool: fast ---------------------------------------------------------------------------


def test_the_rules_and_the_example_config_pass_promtool_check() -> None:
    r = promtool("check", "rules", RULES.name)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = promtool("check", "config", "prometheus.yml")  # loads herder-rules.yaml beside it too
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_rules_pass_their_unit_tests() -> None:
    r = promtool("test", "rules", RULE_TESTS.name)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_each_alert_has_a_case_that_fires_one_that_stays_quiet_and_says_where() -> None:
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    for rule in alerts():
        name = rule["alert"]
        assert rule.get("for") and rule["labels"].get("severity") in {"warning", "critical"}, name
        assert {"summary", "description"} <= rule["annotations"].keys(), name
        assert "$labels.instance" in rule["annotations"]["summary"] or "queue" in rule["expr"], name
        fired = [c for c in cases if c["alertname"] == name and c["exp_alerts"]]
        quiet = [c for c in cases if c["alertname"] == name and not c["exp_alerts"]]
        assert fired and quiet, f"{name}: fired in {len(fired)} cases, quiet in {len(quiet)}"


def test_a_broken_rule_fails_its_unit_test(tmp_path: Path) -> None:
    """The unit tests have teeth: the crash-loop threshold raised tenfold turns them red."""
    rules = RULES.read_text()
    broken = rules.replace("(herder_workers_died_total[5m])) >= 3", "(herder_workers_died_total[5m])) >= 30")
    assert broken != rules
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    r = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert r.returncode != 0 and "HerderWorkerCrashLoop" in r.stdout + r.stderr, r.stdout + r.stderr


# ---- what the real Prometheus sees -----------------------------------------------------------


def documented_metrics() -> dict[str, set[str]]:
    """Every sample name the metrics table of the docs names -> its labels (a counter's
    `_total`, a histogram's `_bucket`, `_count`, `_sum`; `herder_x`, `_y` is herder_x, herder_y)."""
    doc = ROOT / "docs" / "monitoring.md"
    text = (doc if doc.exists() else ROOT / "docs" / "operations.md").read_text()
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("| `herder_"):
            continue
        names, kind, labels = (cell.strip() for cell in line.strip("|").split("|")[:3])
        found = re.findall(r"`(\w+)`", names)
        first = found[0]
        label_set = set(re.findall(r"`(\w+)`", labels))
        for name in found:
            full = first.rsplit("_", 1)[0] + name if name.startswith("_") else name
            if kind == "counter":
                out[full if full.endswith("_total") else full + "_total"] = label_set
            elif kind == "histogram":
                out.update(
                    {
                        full + "_bucket": label_set | {"le"},
                        full + "_count": label_set,
                        full + "_sum": label_set,
                    }
                )
            else:
                out[full] = label_set
    return out


def served_metrics(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    # prometheus-client's own `_created` samples are its bookkeeping, not herder's series.
    return {
        s.name
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if not s.name.endswith("_created")
    }


class ApiError(Exception):
    """Prometheus refused a request (a query that does not parse or evaluate)."""


def api(base: str, path: str, **params: str) -> Any:
    """An answer of Prometheus' HTTP API (its `data`); an error raises ApiError with its text."""
    url = f"{base}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        raise ApiError(f"{path} {params}: {e.code} {e.read().decode(errors='replace')}") from None
    assert body["status"] == "success", body
    return body["data"]


def query(base: str, expr: str) -> list[dict[str, Any]]:
    return api(base, "query", query=expr)["result"]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) for every target, Grafana's variables replaced."""

    def substitute(expr: str) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: GRAFANA_VARIABLES[m.group(1)], expr)

    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], substitute(t["expr"])) for p in panels for t in p.get("targets", []) if "expr" in t]


def as_bool(expr: str) -> str:
    """An alert's expression with each comparison made `bool`: it returns a sample wherever its
    series exist, whether the alert holds or not (label matchers inside {} left alone)."""
    out, depth, i = [], 0, 0
    while i < len(expr):
        c = expr[i]
        depth += (c == "{") - (c == "}")
        m = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool)").match(expr, i) if depth == 0 else None
        if m:
            out.append(m.group(1) + " bool")
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def start_prometheus(tmp_path: Path, herder_port: int) -> tuple[subprocess.Popen[bytes], str]:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],  # the shipped file itself
        "scrape_configs": [
            {"job_name": "herder", "static_configs": [{"targets": [f"127.0.0.1:{herder_port}"]}]}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - the child holds it; closed with it
    proc = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return proc, f"http://127.0.0.1:{port}"


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_a_real_prometheus_sees_every_series_runs_every_query_and_alerts_on_a_crash_loop(
    herder, jobs, tmp_path: Path
) -> None:
    tool("prometheus")
    port = free_port()
    # Autoscaled, so the learned job rate is served too; a job that kills its worker is given
    # up after 5 requeues: 6 deaths in a row.
    h = herder(min_workers="2", max_workers="3", http=f"127.0.0.1:{port}", max_requeues="5")
    h.wait_workers(2)
    prom, base = start_prometheus(tmp_path, port)
    try:
        wait_for(lambda: ready(base + "/-/ready"), 20, what="Prometheus ready")
        # Scraped before the deaths: a counter's first sample is its base for increase().
        wait_for(lambda: query(base, "herder_workers_died_total"), 20, interval=0.25, what="a first scrape")
        for n in range(20):
            jobs.enqueue("record", f"r{n}", 0.05)
        h.wait_status(lambda s: s["jobs"]["ok"] >= 20, 20, what="the jobs done")
        jobs.enqueue("exit_hard", "crash")

        def crash_loop() -> list[dict[str, Any]]:
            return [
                a
                for a in api(base, "alerts")["alerts"]
                if a["labels"]["alertname"] == "HerderWorkerCrashLoop"
            ]

        alert = wait_for(crash_loop, 30, what="HerderWorkerCrashLoop pending")
        assert alert[0]["state"] in {"pending", "firing"} and alert[0]["labels"]["pool"] == "default", alert

        # Every documented series, with its labels, in Prometheus; and /metrics serves no other.
        documented = documented_metrics()
        served = served_metrics(f"http://127.0.0.1:{port}/metrics")
        undocumented, unserved = served - set(documented), set(documented) - served
        assert not undocumented and not unserved, f"undocumented: {undocumented}; not served: {unserved}"

        def scraped() -> dict[str, list[dict[str, str]]]:
            found: dict[str, list[dict[str, str]]] = {}
            for s in api(base, "series", **{"match[]": '{__name__=~"herder_.+"}'}):
                found.setdefault(s["__name__"], []).append(s)
            return found

        # A series /metrics just began to serve (the learned job rate) is in Prometheus after
        # its next scrape: wait for that, then say what is missing, if anything.
        with contextlib.suppress(AssertionError):  # timed out: the asserts below say what is missing
            wait_for(lambda: scraped().keys() >= documented.keys(), 15, interval=0.5, what="every series")
        series = scraped()
        for name, labels in documented.items():
            assert series.get(name), f"{name}: no series in Prometheus"
            missing = [s for s in series[name] if not labels <= s.keys()]
            assert not missing, f"{name}: series without {labels}: {missing}"

        # Every dashboard query and every rule evaluates and returns data.
        empty = []
        for title, expr in dashboard_queries():
            if not wait_for_data(base, expr):
                empty.append(f"dashboard {title!r}: {expr}")
        groups = api(base, "rules")["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        assert len(loaded) == sum(len(g["rules"]) for g in rule_groups()), "not every rule loaded"
        for rule in loaded:
            assert rule["health"] == "ok" and not rule.get("lastError"), rule
            expr = rule["name"] if rule["type"] == "recording" else as_bool(rule["query"])
            if not wait_for_data(base, expr):
                empty.append(f"rule {rule['name']}: {expr}")
        assert not empty, "no data:\n" + "\n".join(empty)
    finally:
        prom.terminate()
        try:
            prom.wait(10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait(10)
    h.stop_and_check()


def wait_for_data(base: str, expr: str, timeout: float = 5) -> bool:
    """The expression returns a sample within `timeout` (a rate needs its second scrape)."""
    try:
        wait_for(lambda: query(base, expr), timeout, interval=0.25, what=expr)
    except AssertionError:
        return False
    return True
