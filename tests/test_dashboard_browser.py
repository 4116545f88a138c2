"""The dashboard page in a real headless Chromium (Debian's chromium and chromium-driver, driven
by selenium) against a real herder and Redis: the workers' rows with their real pids, a chart
that grows as jobs run, a `kill -9` marked on it within 2 s, a scale that needs the operator's
token, the other hosts on the same Redis, and hostile names shown as text.

The tests wait for what the page shows (WebDriverWait), never for a fixed time. Without
chromium, chromedriver or selenium they skip, and fail where CI is set (scripts/setup installs
them with the test extra)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import Herder, free_port, http_status, unanswered_port, wait_for

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1300",
)
HOSTILE = "<img src=x onerror=alert(1)>"
TOKEN = "dashboard-test-token-8f3a"
PAGE_FILES = ("/", "/static/app.js", "/static/app.css", "/static/uplot.iife.min.js", "/static/uplot.min.css")
PAGE_BUDGET = 300 * 1024  # bytes of the page's first load
KILL_SHOWN_WITHIN = 2.0  # seconds from a kill -9 to its event on the page

# What the page shows, read in one script (rows are updated in place between two reads).
READ_TABLE = """
const rows = document.querySelectorAll(arguments[0] + ' tbody tr');
return [...rows].map((r) => [...r.cells].map((c) => c.textContent));
"""
READ_CHART = """
const c = window.herderDashboard && window.herderDashboard.charts.get(arguments[0]);
if (!c) return null;
const d = c.plot.data;  // [t, queue, growth, wanted, running, busy, jobs/s, failed/s]
const max = (a) => Math.max(0, ...a.filter((v) => v !== null));
return {samples: d[0].length, running: max(d[4]), busy: max(d[5]), jobs: max(d[6])};
"""
READ_DEATH = """
const pid = String(arguments[0]);
const died = (e) => e.dataset.pid === pid && e.dataset.kind === 'died';
const li = [...document.querySelectorAll('#events li')].find(died);
const m = [...document.querySelectorAll('#charts .marker')].find(died);
return li && m ? [li.textContent, m.title] : null;
"""
POST_COMMAND_WITHOUT_SESSION = """
const done = arguments[arguments.length - 1];
fetch('/api/command', {method: 'POST', headers: {'Content-Type': 'application/json'},
                       body: JSON.stringify({cmd: 'scale', pool: arguments[0], workers: 3})})
  .then((r) => done(r.status), (e) => done(String(e)));
"""


def missing_tools() -> list[str]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (the test extra)")
    return missing


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    missing = missing_tools()
    if missing:
        why = f"the browser tests need {', '.join(missing)}: scripts/setup installs them with the test extra"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")  # fresh: no cookie, no cache
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.unhandled_prompt_behavior = "ignore"  # an alert() stays open, for the test to find
    service = Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


# ---- helpers ---------------------------------------------------------------------------


def until(driver: Any, timeout: float, check: Callable[[Any], object], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(check, f"waiting {timeout} s for {what}")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def start_with_http(herder: Callable[..., Herder], workers: int, **flags: Any) -> tuple[Herder, str]:
    port = free_port()
    h = herder(workers=str(workers), http=f"127.0.0.1:{port}", **flags)
    base = f"http://127.0.0.1:{port}"
    h.wait_workers(workers)
    wait_for(lambda: http_status(base + "/api/snapshot") == 200, 20, what="/api/snapshot to answer")
    return h, base


def open_page(driver: Any, base: str) -> None:
    driver.get(base + "/")
    until(driver, 15, lambda d: d.find_element("id", "conn").text == "live", "the page to say it is live")


def worker_pids(driver: Any) -> set[int]:
    return {int(row[2]) for row in driver.execute_script(READ_TABLE, "#workers")}


def pool_row(driver: Any, pool: str) -> list[str] | None:
    return next((row for row in driver.execute_script(READ_TABLE, "#pools") if row[0] == pool), None)


def button_texts(driver: Any) -> list[str]:
    return [b.text for b in driver.find_elements("tag name", "button")]


def press(driver: Any, button: str, what: str) -> None:
    """Click a control and wait for the page to say the master did it."""
    driver.find_element("css selector", button).click()
    until(driver, 15, lambda d: d.find_element("id", "notice").text == f"{what}: done", f"'{what}: done'")


def browser_errors(driver: Any, refused: tuple[str, ...] = ()) -> list[str]:
    """The page's console errors: a script error, a CSP violation, a failed load (but for the
    403s the test asked for, at the paths in `refused`)."""
    return [
        e["message"]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and not any(f"{path} - Failed to load resource" in e["message"]
                                              and " 403 " in e["message"] for path in refused)
    ]  # fmt: skip


def no_alert(driver: Any) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        driver.switch_to.alert  # noqa: B018 - raises while no alert is open
    except NoAlertPresentException:
        return True
    return False


# ---- the tests -------------------------------------------------------------------------


def test_workers_chart_and_a_kill_9_marked_within_2_s(herder, jobs, browser, tmp_path: Path) -> None:
    h, base = start_with_http(herder, 2)
    weight = sum(len(urllib.request.urlopen(base + path, timeout=5).read()) for path in PAGE_FILES)
    assert weight < PAGE_BUDGET, f"the page's first load is {weight} bytes"
    pool = get_json(base + "/api/snapshot")["pools"][0]["name"]
    open_page(browser, base)
    pids = {p.pid for p in h.workers()}
    until(browser, 10, lambda d: worker_pids(d) == pids, f"a row for each of the workers {sorted(pids)}")
    # no token configured: read-only, not a button on the page
    assert button_texts(browser) == [] and not browser.find_elements("id", "unlock")

    before = browser.execute_script(READ_CHART, pool)
    ids = [jobs.enqueue("record", "dash", 0.3).id for _ in range(16)]
    until(
        browser,
        30,
        lambda d: (c := d.execute_script(READ_CHART, pool))["busy"] > 0 and c["jobs"] > 0
        and c["samples"] > before["samples"] and c["running"] == 2,
        "the chart to show busy workers and jobs done",
    )  # fmt: skip
    for job_id in ids:
        jobs.wait_finished(job_id, 20, "the chart's jobs to finish")

    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    event, marker = until(browser, KILL_SHOWN_WITHIN, lambda d: d.execute_script(READ_DEATH, victim),
                          f"the kill of {victim} as an event and a chart marker")  # fmt: skip
    took = time.monotonic() - killed
    assert str(victim) in event and str(victim) in marker, (event, marker)
    replacement = h.wait_workers(2, without={victim})
    until(browser, 10, lambda d: worker_pids(d) == {p.pid for p in replacement}, "the replacement's row")
    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    print(f"kill -9 shown after {took:.2f} s; screenshot {shot}")
    assert browser_errors(browser) == []
    h.stop_and_check()


def test_a_worker_that_waits_for_redis_says_why_on_its_row(herder, browser, tmp_path: Path) -> None:
    """A worker whose Redis gets no answer: its row says what it waits for, and for how long."""
    with unanswered_port() as redis_port:
        port = free_port()
        url = f"redis://:pw-not-shown@127.0.0.1:{redis_port}/0"
        h = herder(redis_url=url, workers="2", no_scheduler=True, http=f"127.0.0.1:{port}")
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_status(base + "/api/snapshot") == 200, 20, what="/api/snapshot to answer")
        open_page(browser, base)
        why = f"for Redis at 127.0.0.1:{redis_port}: connect timed out"

        def waiting_rows(d: Any) -> list[list[str]] | None:
            rows = [r for r in d.execute_script(READ_TABLE, "#workers") if why in r[4] and "waiting" in r[4]]
            return rows if len(rows) == 2 else None

        rows = until(browser, 30, waiting_rows, f"both rows to say 'waiting ... {why}'")
        assert all(r[3] == "starting" for r in rows), rows
        shot = tmp_path / "waiting.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
        print(f"screenshot {shot}")
        assert "pw-not-shown" not in browser.page_source
        assert browser_errors(browser) == []
        h.stop_and_check()


def test_a_scale_from_the_page_works_with_the_token_and_is_refused_without(herder, browser) -> None:
    h, base = start_with_http(herder, 1, env={"HERDER_HTTP_TOKEN": TOKEN})
    pool = get_json(base + "/api/snapshot")["pools"][0]["name"]
    open_page(browser, base)
    until(browser, 10, lambda d: d.find_elements("id", "unlock"), "the unlock form")
    assert button_texts(browser) == ["unlock"]  # no control before the token
    status = browser.execute_async_script(POST_COMMAND_WITHOUT_SESSION, pool)
    assert status == 403, status  # the page's own origin, without session and CSRF token

    token = browser.find_element("id", "token")
    token.send_keys("not-the-token")
    browser.find_element("id", "unlock-button").click()
    until(browser, 10, lambda d: "bad" in d.find_element("id", "notice").get_attribute("class"), "a refusal")
    assert button_texts(browser) == ["unlock"] and not browser.find_elements("css selector", "button.scale")

    browser.find_element("id", "token").send_keys(TOKEN)
    browser.find_element("id", "unlock-button").click()
    scale_n = until(browser, 10, lambda d: d.find_element("css selector", "#pools input.scale-n"), "controls")
    scale_n.send_keys("3")
    browser.find_element("css selector", "#pools button.scale").click()
    until(browser, 10, lambda d: "done" in d.find_element("id", "notice").text, "the scale's reply")
    h.wait_workers(3)
    until(browser, 10, lambda d: (row := pool_row(d, pool)) and row[3] == "3" and row[4] == "3",
          "the pool's row to show 3 wanted and running")  # fmt: skip
    until(browser, 10, lambda d: d.find_elements("css selector", "#events li[data-kind=scale]"), "its event")

    # the other controls, each answered and seen on the page
    press(browser, "#pools button.pause", f"pause {pool}")
    until(browser, 10, lambda d: pool_row(d, pool)[1] == "paused", "the pool paused")
    press(browser, "#pools button.pause", f"resume {pool}")
    until(browser, 10, lambda d: pool_row(d, pool)[1] == "running", "the pool running again")
    victim = min(worker_pids(browser))
    press(browser, f"#workers tr[data-pid='{victim}'] button.stop", f"stop worker {victim}")
    until(browser, 20, lambda d: victim not in worker_pids(d) and len(worker_pids(d)) == 3, "its replacement")
    press(browser, "#pools button.restart", f"rolling restart of {pool}")
    until(browser, 10, lambda d: d.find_elements("css selector", "#events li[data-kind=restart]"), "restart")
    assert TOKEN not in browser.page_source and TOKEN not in json.dumps(browser.get_cookies())
    assert browser_errors(browser, refused=("/api/command", "/api/login")) == []
    h.stop_and_check()


def test_other_hosts_are_listed_and_a_hostile_queue_name_is_text(herder, browser) -> None:
    a, base_a = start_with_http(herder, 1)
    b, base_b = start_with_http(herder, 1, queue=["default", HOSTILE])
    id_a = get_json(base_a + "/api/snapshot")["host_id"]
    id_b = get_json(base_b + "/api/snapshot")["host_id"]
    assert id_a != id_b
    open_page(browser, base_a)

    def both_listed(d: Any) -> list[list[str]] | None:
        rows = d.execute_script(READ_TABLE, "#hosts")
        return rows if {r[1] for r in rows} >= {id_a, id_b} else None

    from selenium.common.exceptions import TimeoutException

    try:
        hosts = until(browser, 20, both_listed, "both hosts listed")
    except TimeoutException:
        shown = browser.execute_script(READ_TABLE, "#hosts")
        raise AssertionError(f"hosts shown: {shown}; /api/hosts: {get_json(base_a + '/api/hosts')}") from None
    this = [r for r in hosts if r[0].endswith("(this host)")]
    assert [r[1] for r in this] == [id_a], hosts

    open_page(browser, base_b)
    until(browser, 10, lambda d: any(HOSTILE in row[12] for row in d.execute_script(READ_TABLE, "#pools")),
          "the hostile queue name in the pools table")  # fmt: skip
    shown = browser.find_element("css selector", "#pools tbody").get_attribute("innerHTML")
    assert "&lt;img src=x onerror=alert(1)&gt;" in shown
    seen = browser.execute_script("return window.herderDashboard.state.snapshot.time")
    until(browser, 10, lambda d: d.execute_script("return window.herderDashboard.state.snapshot.time") > seen,
          "another poll drawn")  # fmt: skip
    assert browser.find_elements("tag name", "img") == []
    assert no_alert(browser)
    assert browser_errors(browser) == []
    a.stop_and_check()
    b.stop_and_check()


def test_the_page_rides_out_a_master_restart(herder, browser) -> None:
    h, base = start_with_http(herder, 1)
    open_page(browser, base)
    old = h.master()
    assert old is not None
    # Frozen first, so the page's requests go unanswered (a master restarted between two of its
    # polls would never be missed); then killed, if the watchdog has not already replaced it for
    # its silence: a new master serves the page again.
    os.kill(old.pid, signal.SIGSTOP)
    until(browser, 15, lambda d: d.find_element("id", "conn").text == "reconnecting", "'reconnecting'")
    with contextlib.suppress(ProcessLookupError):
        os.kill(old.pid, signal.SIGKILL)
    wait_for(lambda: (m := h.master()) and m.pid != old.pid, 20, what="a new master")
    pids = {p.pid for p in h.wait_workers(1)}
    until(
        browser,
        30,
        lambda d: d.find_element("id", "conn").text == "live" and worker_pids(d) == pids,
        "the page live again, with the new master's worker",
    )
    h.stop_and_check()


READ_ADVICE = """
const rows = document.querySelectorAll('#advice tbody tr');
return {none: !document.getElementById('no-advice').hidden,
        rows: [...rows].map((r) => [...r.cells].map((c) => c.textContent)),
        markup: [...rows].some((r) => r.querySelector('td *') !== null)};
"""


def test_the_advice_panel_shows_a_leaks_max_jobs(herder, jobs, browser, tmp_path: Path) -> None:
    """A worker that keeps 1 MiB a job: the panel says nothing at first, then the recycling
    advice as text, with the change and what it rests on."""
    h, base = start_with_http(herder, 1)
    open_page(browser, base)
    assert browser.execute_script(READ_ADVICE) == {"none": True, "rows": [], "markup": False}
    for n in range(150):
        jobs.enqueue("leak", f"panel{n}", 1, 0.3)

    def recycling(d: Any) -> list[str] | None:
        shown = d.execute_script(READ_ADVICE)
        return next((r for r in shown["rows"] if r[1] == "recycling" and "max_jobs" in r[3]), None)

    row = until(browser, 60, recycling, "the recycling advice on the panel")
    served = [a for a in get_json(base + "/api/snapshot")["advice"] if a["kind"] == "recycling"]
    assert row[0] == "default" and "RSS grows" in row[2] and row[3].startswith("max_jobs = "), row
    assert served and served[0]["change"]["max_jobs"] > 0, served
    assert " jobs, " in row[4] and row[4].endswith(" min"), row
    shown = browser.execute_script(READ_ADVICE)
    assert not shown["none"] and not shown["markup"], shown
    shot = tmp_path / "advice.png"
    assert browser.find_element("id", "advice-section").screenshot(str(shot))
    print(f"advice panel: {shown['rows']}; screenshot {shot}")
    assert browser_errors(browser) == []
    h.stop_and_check()


READ_HANDOVER = """
const b = document.getElementById('handover');
return {version: document.getElementById('version').textContent, shown: !b.hidden, text: b.textContent,
        markup: b.children.length > 0};
"""


def test_a_herder_upgrade_shows_a_banner_naming_both_masters(herder, jobs, browser, tmp_path: Path) -> None:
    """A real `herder upgrade` (this checkout to itself) while both workers run a 6 s job, so
    the hand-over lasts a few of the page's polls: the header shows the version throughout, the
    banner names both masters, their versions and the old one's workers left, then goes."""
    from herder.supervisor import __version__

    h, base = start_with_http(herder, 2)
    old = h.master()
    assert old is not None
    open_page(browser, base)
    until(browser, 10, lambda d: d.execute_script(READ_HANDOVER)["version"] == f"herder {__version__}",
          "the version in the header")  # fmt: skip
    assert not browser.execute_script(READ_HANDOVER)["shown"]
    ids = [jobs.enqueue("record", "upgrade", 6.0).id for _ in range(2)]  # A's workers busy: a slow hand-over
    wait_for(lambda: len(jobs.started("upgrade")) == 2, 10, what="both jobs to start")
    cli = subprocess.Popen(
        [h.argv[0], "upgrade", "--state-dir", h.state_dir, "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        prefix = f"upgrading: master {old.pid} (herder {__version__}) -> master "
        banner = until(browser, 20, lambda d: (b := d.execute_script(READ_HANDOVER))["shown"]
                       and b["text"].startswith(prefix) and b, "the hand-over banner")  # fmt: skip
        shot = tmp_path / "handover.png"
        assert browser.find_element("id", "top").screenshot(str(shot))
        print(f"banner: {banner['text']!r}; screenshot {shot}")
        assert f"(herder {__version__}): " in banner["text"] and " workers left, " in banner["text"], banner
        assert not banner["markup"] and banner["version"] == f"herder {__version__}", banner
        out, err = cli.communicate(timeout=90)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 0, out + err
    new = h.master()
    assert new is not None and new.pid != old.pid
    until(browser, 15, lambda d: not d.execute_script(READ_HANDOVER)["shown"], "the banner gone afterwards")
    for i in ids:
        jobs.wait_finished(i, 20, what="the jobs A's workers ran")
    assert browser_errors(browser) == []
    h.stop_and_check()
