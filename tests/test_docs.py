"""The user docs say what the code does: every flag and command is documented, docs/settings.md is
the schema's own rendering, the example command lines parse with the real CLI, no user doc
carries an issue number, and the worker channel's version is the code's. Fast: no process is
started (click's parsing only)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from herder.common import worker_protocol
from herder.common.config import reference
from herder.supervisor.ctl.cli import cli

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Where example command lines must parse: the pages a newcomer copies commands from.
EXAMPLE_PAGES = [
    REPO / "README.md",
    REPO / "docs" / "install.md",
    *sorted((REPO / "docs" / "deploy").glob("*.md")),
]
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
    for word in words:
        if word in ("&&", "||", "|", ";"):
            segments.append([])
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
