"""The user docs say what the code does: every flag and command is documented, docs/settings.md is
the schema's own rendering, the example command lines parse with the real CLI, no user doc
carries an issue number, and the worker channel's version is the code's. Fast: no process is
started (click's parsing only)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from herder.common import worker_protocol
from herder.common.config import reference
from herder.supervisor.ctl.cli import cli

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Where example command lines must parse: every page, since a reader copies commands from any.
EXAMPLE_PAGES = DOCS
SHELL_FENCE = re.compile(r"^```(?:sh|bash|shell|console)\s*$")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def corpus() -> str:
    return "\n".join(p.read_text() for p in DOCS)


def flags_in(text: str) -> set[str]:
    """Every `--flag` the text names, whole: `--max` is not the head of `--max-workers`."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w-])", text))


def options_of(command: click.Command) -> list[str]:
    return [
        o
        for p in command.params
        if isinstance(p, click.Option)
        for o in (*p.opts, *p.secondary_opts)
        if o.startswith("--") and o != "--help"
    ]


def test_every_run_flag_is_documented() -> None:
    named = flags_in(corpus())
    missing = [o for o in options_of(cli.commands["run"]) if o not in named]
    assert not missing, f"`herder run` flags in no doc (README.md, docs/**/*.md): {missing}"


def test_every_command_and_its_options_are_documented() -> None:
    text = corpus()
    named = flags_in(text)
    missing = [f"herder {name}" for name in cli.commands if f"herder {name}" not in text]
    missing += [f"herder {o}" for o in options_of(cli) if o not in named]  # --version
    for name, command in cli.commands.items():
        missing += [f"herder {name} {o}" for o in options_of(command) if o not in named]
    assert not missing, f"commands or options in no doc (README.md, docs/**/*.md): {missing}"


def test_settings_page_is_the_schemas_rendering() -> None:
    page = REPO / "docs" / "settings.md"
    assert page.read_text() == reference.render(), (
        f"docs/settings.md is out of date with the config schema: regenerate it with `{reference.COMMAND}`"
    )


def shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, command) of each shell line in the page's sh/bash code blocks, a line ending
    in a backslash joined with the next."""
    out: list[tuple[int, str]] = []
    fenced, pending, start = False, "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()  # a block inside a list item is indented
        if line.startswith("```"):
            fenced = bool(SHELL_FENCE.match(line)) and not fenced
            continue
        if not fenced:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def herder_invocations(command: str) -> list[list[str]]:
    """The argument lists of every `herder ...` in a shell line (after sudo, in any stage of a
    pipeline or `&&` list): the program is any path whose name is `herder`."""
    words = shlex.split(command, comments=True)
    segments: list[list[str]] = [[]]
    redirected = False
    for word in words:
        if word in ("&&", "||", "|", ";"):
            segments.append([])
        elif word in (">", ">>", "<", "2>", "2>>"):
            redirected = True  # the shell's, not herder's: it and its file are no arguments
        elif redirected:
            redirected = False
        else:
            segments[-1].append(word)
    found = []
    for seg in segments:
        if seg[:2] == ["sudo", "-u"]:
            seg = seg[3:]
        elif seg[:1] == ["sudo"]:
            seg = seg[1:]
        if seg and Path(seg[0]).name == "herder":
            found.append(seg[1:])
    return found


def parse_problem(args: list[str]) -> str | None:
    """Why click refuses these arguments to `herder`, or None; nothing is run."""
    if not args:
        return "no command"
    if args[0].startswith("-"):
        known = {o for p in cli.params for o in p.opts}
        return None if args[0] in known else f"no such option {args[0]}"
    command = cli.commands.get(args[0])
    if command is None:
        return f"no such command {args[0]!r}"
    try:
        command.make_context(args[0], list(args[1:]), resilient_parsing=False)
    except click.exceptions.Exit:  # --help
        return None
    except click.ClickException as exc:
        return exc.format_message()
    return None


def example_commands() -> list[tuple[str, list[str]]]:
    return [
        (f"{rel(page)}:{number}", args)
        for page in EXAMPLE_PAGES
        for number, line in shell_lines(page)
        for args in herder_invocations(line)
    ]


def test_the_pages_have_example_commands() -> None:
    where = {w.split(":")[0] for w, _ in example_commands()}
    assert {"README.md", "docs/install.md", "docs/deploy/systemd.md", "docs/deploy/launchd.md"} <= where


@pytest.mark.parametrize(
    ("where", "args"), example_commands(), ids=lambda v: v if isinstance(v, str) else None
)
def test_example_command_lines_parse(where: str, args: list[str]) -> None:
    problem = parse_problem(args)
    assert problem is None, f"{where}: `herder {shlex.join(args)}`: {problem}"


ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+|(?<![\w&/])#\d+\b", re.I)


def test_no_user_doc_carries_an_issue_number() -> None:
    found = [
        f"{rel(page)}:{number}: {m.group(0)}"
        for page in DOCS
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for m in ISSUE_NUMBER.finditer(line)
    ]
    assert not found, "user docs speak to users (history goes to CHANGELOG.md): " + "; ".join(found)


CHANNEL_VERSION = re.compile(r"worker channel (?:is at )?version (\d+)", re.I)


def test_the_docs_give_the_worker_channel_version_the_code_speaks() -> None:
    title = (REPO / "docs" / "protocol.md").read_text().splitlines()[0]
    assert CHANNEL_VERSION.search(title), f"docs/protocol.md's title names no worker channel version: {title}"
    stated = [
        (rel(page), int(m.group(1)))
        for page in DOCS
        for m in CHANNEL_VERSION.finditer(page.read_text().replace("\n", " "))
    ]
    wrong = [(page, v) for page, v in stated if v != worker_protocol.VERSION]
    assert not wrong, f"the worker channel is at version {worker_protocol.VERSION}, the docs say: {wrong}"


def toml_examples() -> list[tuple[str, str]]:
    """Every ```toml block of the docs: (file:line, its text)."""
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "```toml":
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
                found.append((f"{rel(path)}:{i + 1}", "\n".join(lines[i + 1 : end]) + "\n"))
    return found


@pytest.mark.parametrize(("where", "text"), toml_examples(), ids=[w for w, _ in toml_examples()])
def test_config_examples_are_valid_configs(where: str, text: str, tmp_path: Path) -> None:
    """A config file a page shows is one herder takes: `herder config --config` accepts it."""
    path = tmp_path / "herder.toml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["config", "--config", str(path)], env={"HERDER_CONFIG": None})
    assert result.exit_code == 0, f"{where}: {result.output}"


# ---- Benchmark figures: quoted from benchmarks.md, never from memory -------------------------

BENCHMARKS = REPO / "docs" / "benchmarks.md"
SIMPLE = "rq worker-pool -w rq.worker.SimpleWorker"
IDLE_CRASH = "Crash to replacement at idle"
NOISY_CRASH = "Crash to replacement under noisy"
IDLE_POOLS = "Start-up, memory and graceful stop"
SCALING = "Scaling: pool sizes"
DASHBOARD = "The dashboard's cost to the master"
SPIKE = "Autoscaling: a spike"
BURSTS = "Trace bursts"  # of "Autoscaling on traces"
ADVICE_THREADS = "threads"  # of "Advice, applied" (a heading other sections do not start with)
# A table whose heading is only unique within its section: the section it is looked for in.
SECTION_OF = {ADVICE_THREADS: "## Advice, applied"}
CPU_PER_1000 = "supervisor CPU per 1,000 jobs"

# Each figure a page quotes from docs/benchmarks.md: (page, pattern whose one group is the figure
# as written, benchmarks.md table (the start of its heading), row (its first cell; "herder at 4"
# where the table has a workers column), column). A cell's unit (" ms") may be left out of a quote.
# A pattern is matched against the page with its whitespace collapsed, so a quote may wrap.
QUOTED_FIGURES: list[tuple[str, str, str, str, str]] = [
    (
        "README.md",
        r"at ([\d.]+x) the throughput of `rq worker-pool -w SimpleWorker`",
        "Ratios",
        f"herder / {SIMPLE}",
        "jobs/s",
    ),
    (
        "README.md",
        r"and ([\d.]+x) that of supervisord \+ `rq worker`",
        "Ratios",
        "herder / supervisord + rq worker -w rq.worker.SimpleWorker",
        "jobs/s",
    ),
    ("README.md", r"replacement ([\d.]+ ms) after the `kill -9`", IDLE_CRASH, "herder", "listed median"),
    ("README.md", r"after the `kill -9` \(rq's pool: ([\d.]+ ms)\)", IDLE_CRASH, SIMPLE, "listed median"),
    ("README.md", r"holds ([\d.]+ MB) of memory of its own", IDLE_POOLS, "herder", "worker USS"),
    ("README.md", r"of its own \(rq's pool: ([\d.]+ MB)\)", IDLE_POOLS, SIMPLE, "worker USS"),
    (
        "README.md",
        r"first job is done ([\d.]+ ms) after the launch",
        IDLE_POOLS,
        "herder",
        "launch -> first job done",
    ),
    (
        "README.md",
        r"after the launch \(rq's pool: ([\d.]+ ms)\)",
        IDLE_POOLS,
        SIMPLE,
        "launch -> first job done",
    ),
    ("docs/operations.md", r"listed by RQ ([\d.]+ ms) after a crash", IDLE_CRASH, "herder", "listed median"),
    (
        "docs/operations.md",
        r"after a crash \(([\d.]+ ms) among busy workers",
        NOISY_CRASH,
        "herder",
        "listed median",
    ),
    (
        "docs/design.md",
        r"its CPU per 1,000 jobs is (\d+) ms at 4 workers",
        SCALING,
        "herder at 4",
        CPU_PER_1000,
    ),
    ("docs/design.md", r"at 4 workers, (\d+) ms at 64", SCALING, "herder at 64", CPU_PER_1000),
    ("docs/design.md", r"ms at 64 and (\d+) ms at 256", SCALING, "herder at 256", CPU_PER_1000),
]
IDLE_CPU, JOB_CPU = "master CPU idle, ms/s", "master CPU per 1,000 jobs, ms"
QUOTED_FIGURES += [
    ("docs/dashboard.md", pattern, DASHBOARD, row, column)
    for pattern, row, column in [
        (r"went from ([\d.]+) to [\d.]+ ms a second with 4", IDLE_CPU, "4 workers, page closed"),
        (r"went from [\d.]+ to ([\d.]+) ms a second with 4", IDLE_CPU, "4 workers, page open"),
        (r"and from ([\d.]+) to [\d.]+ ms with 64", IDLE_CPU, "64 workers, page closed"),
        (r"and from [\d.]+ to ([\d.]+) ms with 64", IDLE_CPU, "64 workers, page open"),
        (r"per 1,000 jobs from (\d+) to \d+ ms", JOB_CPU, "4 workers, page closed"),
        (r"per 1,000 jobs from \d+ to (\d+) ms", JOB_CPU, "4 workers, page open"),
        (r"and from (\d+) to \d+ ms \(", JOB_CPU, "64 workers, page closed"),
        (r"and from \d+ to (\d+) ms \(", JOB_CPU, "64 workers, page open"),
    ]
]
QUOTED_FIGURES += [
    (
        "docs/advice.md",
        r"the whole tree from ([\d.]+) to [\d.]+ MB of PSS",
        ADVICE_THREADS,
        "PSS, MB",
        "--workers 8",
    ),
    (
        "docs/advice.md",
        r"the whole tree from [\d.]+ to ([\d.]+) MB of PSS",
        ADVICE_THREADS,
        "PSS, MB",
        "--threads 8 --workers 1",
    ),
]
QUOTED_FIGURES += [
    (
        "docs/scaling.md",
        r"max workers ([\d.]+ s) after the spike",
        SPIKE,
        "spike to max workers",
        "herder (measured)",
    ),
    ("docs/scaling.md", r"queue drained at ([\d.]+ s)", SPIKE, "spike to queue drained", "herder (measured)"),
    (
        "docs/scaling.md",
        r"it spent (\d+) worker-seconds where KEDA",
        BURSTS,
        "herder --max-wait 5",
        "worker-s",
    ),
    (
        "docs/scaling.md",
        r"where KEDA's rule scaled to the trace spent (\d+)",
        BURSTS,
        "KEDA-like (scaled)",
        "worker-s",
    ),
    (
        "docs/scaling.md",
        r"back to 1 worker ([\d.]+ s) after that",
        SPIKE,
        "drained to min workers",
        "herder (measured)",
    ),
]
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?\s?(?:x|ms|s|MB|MiB|GB|%|jobs/s)(?![\w/])")


def tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Every markdown table of the text by the heading above it: its rows, each {column: cell}
    (the first column's header may be empty: its key is "")."""
    found: dict[str, list[dict[str, str]]] = {}
    heading, header, rows = "", None, None
    for line in text.splitlines():
        if line.startswith("#"):
            heading, header = line.lstrip("#").strip(), None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header, rows = cells, found.setdefault(heading, [])
            elif not set("".join(cells)) <= set("-: "):  # not the |---| line
                rows.append(dict(zip(header, cells, strict=False)))
        else:
            header = None
    return found


def results_cell(where: str, row: str, column: str) -> str:
    """A cell of docs/benchmarks.md: of a table of its "Results" (the report of its latest full
    run), or of a scenario's section (the dashboard's, the spike's, the traces')."""
    text = BENCHMARKS.read_text()
    if where in SECTION_OF:
        text = text.split(f"\n{SECTION_OF[where]}\n", 1)[1].split("\n## ", 1)[0]
    elif where not in (DASHBOARD, SPIKE, BURSTS):
        text = text.split("\n## Results\n", 1)[1].split("\n## Reading the results", 1)[0]
    matches = [rows for heading, rows in tables(text).items() if heading.startswith(where)]
    assert len(matches) == 1, f"benchmarks.md: {len(matches)} tables under a heading starting {where!r}"

    def key(r: dict[str, str]) -> str:
        first = next(iter(r.values()))
        return f"{first} at {r['workers']}" if "workers" in r else first

    cells = [r[column] for r in matches[0] if key(r) == row and column in r]
    assert len(cells) == 1, f"benchmarks.md, {where!r}: no one row {row!r} with a column {column!r}"
    return cells[0]


def flat(page: str) -> str:
    return " ".join((REPO / page).read_text().split())


def test_every_quoted_benchmark_figure_is_the_results_one() -> None:
    """A figure quoted from the benchmark is the one docs/benchmarks.md records now: a new run
    that moves it fails here until the quote follows."""
    wrong = []
    for page, pattern, where, row, column in QUOTED_FIGURES:
        found = re.findall(pattern, flat(page))
        assert len(found) == 1, f"{page}: {len(found)} places match {pattern!r} (QUOTED_FIGURES is stale)"
        recorded = results_cell(where, row, column)
        if found[0] not in (recorded, recorded.removesuffix(" ms")):
            wrong.append(
                f"{page} says {found[0]}, benchmarks.md's {where!r} {row!r} {column!r} says {recorded}"
            )
    assert not wrong, "stale benchmark figures: " + "; ".join(wrong)


def test_readmes_performance_figures_are_all_quoted() -> None:
    """README's Performance section states no figure that QUOTED_FIGURES does not tie to Results."""
    readme = flat("README.md")
    start = readme.index("## Performance")
    end = readme.find("## ", start + 3)
    section = (start, len(readme) if end < 0 else end)
    tied = [
        m.span(1)
        for page, pattern, *_ in QUOTED_FIGURES
        if page == "README.md"
        for m in re.finditer(pattern, readme)
    ]
    loose = [
        m.group(0)
        for m in FIGURE.finditer(readme, *section)
        if not any(a <= m.start() and m.end() <= b for a, b in tied)
    ]
    assert not loose, (
        f"README.md's Performance states figures not tied to benchmarks.md (QUOTED_FIGURES): {loose}"
    )


def test_no_user_doc_names_a_commit() -> None:
    """The user docs say what is, not at which commit it was measured (that is the commit
    message's and CHANGELOG's)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tokens = {
        (rel(page), t)
        for page in DOCS
        for t in re.findall(r"\b[0-9a-f]{7,40}\b", page.read_text())  # a word of a-f too: git decides
    }
    named = [
        f"{page}: {t}"
        for page, t in sorted(tokens)
        if subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{t}^{{commit}}"], capture_output=True, check=False
        ).returncode
        == 0
    ]
    assert not named, (
        "commit hashes in user docs (they belong in CHANGELOG.md or a commit message): " + "; ".join(named)
    )


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The #fragments GitHub gives a page's headings: lower case, punctuation but - and _
    dropped, spaces as -; a repeated heading gets -1, -2."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_link_between_the_docs_lands() -> None:
    """Every relative link of README.md and docs/ names a file that exists and, with a #fragment,
    a heading of that page (a page moved or a heading renamed breaks no link)."""
    broken = []
    for page in DOCS:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                path, _, fragment = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    broken.append(f"{rel(page)}:{number}: {target} (no such file)")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    broken.append(f"{rel(page)}:{number}: {target} (no such heading)")
    assert not broken, "broken links: " + "; ".join(broken)


def test_control_pages_reload_table_puts_every_key_where_the_schema_does() -> None:
    """docs/control.md's Reload table lists every setting in the row of what a reload does with
    it (settings.md's reload column), so a reader of one page is not told less than the other."""
    from dataclasses import fields

    from herder.common.config.reload import RELOAD_LIMITS
    from herder.common.config.schema import APPLY, RESTART, WORKERS, Config

    rows = {"applied at once": APPLY, "new workers pick it up": WORKERS, "refused: restart herder": RESTART}
    table = (REPO / "docs" / "control.md").read_text().partition("| what a changed key does | keys |")[2]
    listed: dict[str, set[str]] = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        what, keys = line.strip("|").split("|", 1)
        policy = next(p for head, p in rows.items() if what.strip().startswith(head))
        listed[policy] = set(re.findall(r"`([a-z_]+)`", keys))
    wrong = []
    for f in fields(Config):
        policy = f.metadata.get("reload")
        if policy is None:
            continue
        if f.name not in listed.get(policy, set()):
            wrong.append(f"{f.name} not in the {policy!r} row")
        others = {p for p, keys in listed.items() if f.name in keys and p != policy}
        if others - ({RESTART} if f.name in RELOAD_LIMITS else set()):  # refused past a limit
            wrong.append(f"{f.name} also in the {sorted(others)} row")
    assert not wrong, "docs/control.md, Reload: " + "; ".join(wrong)
