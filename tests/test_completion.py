"""Shell completion, click's own: `_HERDER_COMPLETE={bash,zsh,fish}_source herder` prints the script a
shell sources, and that script asks herder itself (`_HERDER_COMPLETE=bash_complete` with the words
typed so far) what may come next. Run against the herder beside this test's Python."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from harness import HERDER


def herder_completing(**env: str) -> str:
    """What herder prints with click's completion variables set: it completes, it runs nothing."""
    r = subprocess.run([HERDER], env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"herder exited {r.returncode} with {env}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def bash_offers(line: str) -> list[str]:
    """The words bash completion offers after `line`, asked the way the bash script asks: every
    word typed so far in COMP_WORDS, the index of the word being completed in COMP_CWORD."""
    words = line.split(" ")
    answer = herder_completing(
        _HERDER_COMPLETE="bash_complete", COMP_WORDS=line, COMP_CWORD=str(len(words) - 1)
    )
    # One `type,value` a line; `plain` is a word to offer (`file`/`dir` hand over to the shell).
    rows = (row.partition(",") for row in answer.splitlines())
    return [value for kind, _, value in rows if kind == "plain"]


@pytest.mark.parametrize(
    ("shell", "marks"),
    [
        ("bash", ("_herder_completion()", "_HERDER_COMPLETE=bash_complete", "complete -o nosort -F")),
        ("zsh", ("#compdef herder", "_HERDER_COMPLETE=zsh_complete", "compdef _herder_completion herder")),
        ("fish", ("function _herder_completion", "_HERDER_COMPLETE=fish_complete", "complete --no-files")),
    ],
)
def test_each_shell_gets_a_script_that_calls_back_into_herder(shell: str, marks: tuple[str, ...]) -> None:
    script = herder_completing(_HERDER_COMPLETE=f"{shell}_source")
    missing = [m for m in marks if m not in script]
    assert not missing, f"{shell}'s completion script lacks {missing}:\n{script}"


def test_bash_completes_a_command_name() -> None:
    offered = bash_offers("herder st")
    assert {"status", "stop"} <= set(offered), offered
    assert all(word.startswith("st") for word in offered), offered


def test_bash_completes_a_commands_options() -> None:
    offered = bash_offers("herder status --")
    assert "--json" in offered, offered
    assert all(word.startswith("--") for word in offered), offered


@pytest.mark.slow
def test_the_bash_script_completes_in_bash() -> None:
    """The script as a user sources it, its function run as bash runs it on <Tab>: the words
    land in COMPREPLY, and herder is the command the function is registered for."""
    bash = shutil.which("bash")
    assert bash, "bash is not installed"
    script = herder_completing(_HERDER_COMPLETE="bash_source")
    drive = (
        'eval "$SCRIPT"\n'
        "complete -p herder\n"
        "COMP_WORDS=(herder st); COMP_CWORD=1\n"
        "_herder_completion herder 2>/dev/null\n"  # compopt complains outside a real <Tab>
        'printf "offered:%s\\n" "${COMPREPLY[@]}"\n'
    )
    path = f"{os.path.dirname(HERDER)}{os.pathsep}{os.environ.get('PATH', '')}"  # `herder` as typed
    r = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", drive],
        env={**os.environ, "SCRIPT": script, "PATH": path},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert "_herder_completion herder" in r.stdout, r.stdout
    offered = [line.removeprefix("offered:") for line in r.stdout.splitlines() if line.startswith("offered:")]
    assert {"status", "stop"} <= set(offered), r.stdout
