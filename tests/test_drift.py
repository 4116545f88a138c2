"""Docs and comments that cannot drift from the code they describe.

1. Protocol versions: every statement of a channel's current version in docs/protocol.md and in
   the protocol modules' docstrings and comments is the version the code speaks.
2. Names: every module, class, function, method or file that the docs (README.md,
   docs/**/*.md, supervisor/views/API.md) or the comments and docstrings of the repository's
   Python files name exists. What counts as a name, by rule (EXTRACTION below):
   - inside backticks (docs outside code blocks, comments, docstrings): a file path
     (`supervisor/children/fleet.py`, `views/build.py`, `fast_path/`, `pools.py`), a dotted name
     (`herder.supervisor.children.fleet.Slot`, `fleet.Slot`, `Commands.handle_requests`, `os.environ`)
     or a CamelCase name (`HostSnapshot`);
   - anywhere: `herder.x.y` names and paths ending in .py or .md (`tests/test_hosts.py`,
     `(budget.py)`, `docs/design.md`); in code, what follows "see" when it is dotted or CamelCase
     (`see Channel.on_beat`);
   - anywhere: `<page>.md, "<Section>"` names a section heading of that page.
   How a name resolves (RESOLUTION below): a path against the repository (from its root, or as
   the tail of some path in it; `*` globs; `file::test` a test in it); `herder.*` by importing
   and getattr; `module.Name` by the herder modules of that name; Class.attr by herder's classes
   of that name, else the builtins', RQ's and redis-py's (in a comment, first the commenting
   file's own classes); a stdlib or installed module by importing it. The instance convention holds
   throughout: `pool.target` is a Pool's `target`, `job.origin` an RQ Job's `origin` (an
   instance's attribute: getattr, annotations or `self.x = ...` in the class's source). A bare
   CamelCase name may also be a key of deploy/'s service templates (`TimeoutStopSec`).
   Not code names, skipped by rule: tokens with a space, `://` or a leading `-` (commands,
   URLs, flags), UPPER_CASE and snake_case words without a dot (settings and their variables,
   Redis commands, constants, protocol verbs, JSON fields, metrics), dotted names whose head is
   neither a module nor a class (JSON paths like `totals.recycled`, cgroup files like
   `memory.max`), and paths whose first folder is none of the repository's (`share/herder`).
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from herder.common import control_protocol, uplink_protocol, worker_protocol

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {
    "herder.common": "common",
    "herder.supervisor": "supervisor",
    "herder.worker": "worker",
    "herder.watchdog": "watchdog",
}
FOLDERS = (
    "supervisor",
    "worker",
    "watchdog",
    "common",
    "tests",
    "scripts",
    "deploy",
    "docs",
    "examples",
    ".ci",
)
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "supervisor" / "views" / "API.md"]
CODE = sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)
PROTOCOL_MD = REPO / "docs" / "protocol.md"

# Names that resolve by no rule above, each for a reason.
ALLOWED: set[str] = {
    "io.herder",  # launchd's label for herder (docs/deploy/launchd.md), not Python's io module
    "manage.py",  # a Django project's own script, the user's
    "scheduler.cron",  # the status JSON's fields (docs/control.md, API.md), not a module's names
    "scheduler.where",
}

# Stale references known and not fixed yet: (file, name). Whoever fixes one removes its entry;
# an entry that no longer fails fails the test.
PENDING: set[tuple[str, str]] = set()


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---- 1. protocol versions ---------------------------------------------------------------

# Each pattern states a channel's *current* version (history, "since version 5", is not).
WORKER_STATEMENTS = [
    re.compile(r"worker channel (?:is at )?version (\d+)", re.I),
    re.compile(r"protocol version \(1 to (\d+)\)", re.I),
    re.compile(r"`HERDER_PROTOCOL_VERSION` \|[^|\n]*`(\d+)`"),
]
UPLINK_STATEMENTS = [
    re.compile(r"uplink (?:is at )?version (\d+)", re.I),
    re.compile(r"`ready <pid> <ts> (\d+)`"),
]


def statements(text: str, patterns: list[re.Pattern[str]]) -> list[tuple[int, int]]:
    """(line, version) of every match; a statement may wrap onto the next line."""
    flat = text.replace("\n", " ")
    return [(text.count("\n", 0, m.start()) + 1, int(m.group(1))) for p in patterns for m in p.finditer(flat)]


@cache
def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each comment and docstring (a string alone as a statement) of a Python
    file, one tokenize pass."""
    out = []
    statement_start = True
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and statement_start):
            out.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            statement_start = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return out


@pytest.mark.parametrize(
    ("channel", "module", "patterns"),
    [("worker", worker_protocol, WORKER_STATEMENTS), ("uplink", uplink_protocol, UPLINK_STATEMENTS)],
)
def test_protocol_versions_stated_are_the_codes(channel: str, module: Any, patterns: list) -> None:
    text = PROTOCOL_MD.read_text()
    stated = [(f"docs/protocol.md:{line}", v) for line, v in statements(text, patterns)]
    # The title and the Versioning section both say it.
    assert len(stated) >= 2, f"docs/protocol.md states no current {channel} version: {stated}"
    code = Path(module.__file__)
    for line, chunk in comments_and_docstrings(code):
        stated += [(f"{rel(code)}:{line + d - 1}", v) for d, v in statements(chunk, patterns)]
        # "at version N" in the module's own words is its current version too.
        at = re.compile(r"\bat version (\d+)\b")
        stated += [(f"{rel(code)}:{line + d - 1}", v) for d, v in statements(chunk, [at])]
    wrong = [f"{where}: {v}" for where, v in stated if v != module.VERSION]
    for where in wrong:
        print(where)
    assert not wrong, f"the {channel} channel is at version {module.VERSION}, these say otherwise: {wrong}"


def test_worker_channel_history_ends_at_the_current_version() -> None:
    """Each version has its note, in the module's comments and in the doc's Versioning section,
    and nothing speaks of a version the code does not know."""
    version = worker_protocol.VERSION
    assert worker_protocol.SUPPORTED_VERSIONS[-1] == str(version)
    code = Path(worker_protocol.__file__).read_text()
    notes = [int(n) for n in re.findall(r"^# Version (\d+):", code, re.M)]
    assert notes == list(range(2, version + 1)), f"worker_protocol.py's version notes: {notes}"
    section = PROTOCOL_MD.read_text().split("## Versioning", 1)[1]
    said = {int(n) for n in re.findall(r"\b[Vv]ersion (\d+)", section)}
    assert max(said) == version and said >= set(range(2, version + 1)), f"## Versioning names {said}"
    named = re.compile(r"\b(?:protocol|channel) version (\d+)", re.I)
    future = [
        f"{rel(path)}:{line}"
        for path in [*DOCS, *CODE]
        for line, n in statements(path.read_text(), [named])
        if n > version
    ]
    assert not future, f"a protocol version the code does not speak yet: {future}"


def test_control_channel_is_unversioned_or_documented() -> None:
    """The control socket's JSON has no version; if it gets one, docs/control.md must state it."""
    version = getattr(control_protocol, "VERSION", None)
    if version is not None:
        assert re.search(rf"version {version}\b", (REPO / "docs" / "control.md").read_text())


# ---- 2. names ---------------------------------------------------------------------------

# EXTRACTION
BACKTICKED = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*```")
URL = re.compile(r"\b\w+://\S+")
HERDER_NAME = re.compile(r"\bherder\.(?:common|supervisor|worker|watchdog)(?:\.\w+)*")
PATH = re.compile(r"(?<![\w./:{$<-])((?:[\w-]+/)*[\w-]+\.(?:py|md))(?![\w/-])")
SEE = re.compile(r"\b[Ss]ee `?([A-Za-z_]\w*(?:\.\w+)+|[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)\b")
SECTION = re.compile(r"\b([\w-]+\.md)(?:,|:)? \(?\"([^\"]+)\"")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+")  # HostSnapshot, not NaN or HTTP
FILE_EXTENSIONS = (".py", ".md", ".sh", ".in", ".html", ".js", ".css", ".toml", ".json", ".yaml", ".yml")


def doc_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, text, inside a fenced block) of a markdown page."""
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        yield n, line, fenced


def backticked_names(token: str) -> list[str]:
    """The code name a backticked token is, if it is one (rules in the module's docstring)."""
    token = token.strip().removesuffix("()")
    if " " in token or token.startswith("-") or "://" in token or not token:
        return []
    if "/" in token or token.endswith(FILE_EXTENSIONS):
        return [token]
    if DOTTED.fullmatch(token) or CAMEL.fullmatch(token):
        return [token]
    return []


def prose_names(text: str, code: bool) -> list[str]:
    text = URL.sub("", text)
    found = HERDER_NAME.findall(text) + PATH.findall(text)
    if code:  # the docs' backticks are read apart, outside their code blocks
        found += SEE.findall(text)
        found += [name for token in BACKTICKED.findall(text) for name in backticked_names(token)]
    return found


def references() -> Iterator[tuple[str, str]]:
    """(file:line, name) for every name the docs and the comments make."""
    for page in DOCS:
        for n, line, fenced in doc_lines(page):
            names = prose_names(line, code=False)
            if not fenced:
                names += [name for token in BACKTICKED.findall(line) for name in backticked_names(token)]
            for name in dict.fromkeys(names):
                yield f"{rel(page)}:{n}", name
    for path in CODE:
        for line, text in comments_and_docstrings(path):
            for d, chunk in enumerate(text.splitlines()):
                for name in dict.fromkeys(prose_names(chunk, code=True)):
                    yield f"{rel(path)}:{line + d}", name


# RESOLUTION


@cache
def repo_paths() -> tuple[set[str], set[str]]:
    """Every file and folder of the repository's folders (relative paths), and the folders' names."""
    paths: set[str] = set()
    for folder in FOLDERS:
        for p in (REPO / folder).rglob("*"):
            if "__pycache__" not in p.parts:
                paths.add(rel(p))
        paths.add(folder)
    paths |= {p.name for p in REPO.iterdir() if p.is_file()}
    names = {part for p in paths if (REPO / p).is_dir() for part in Path(p).parts}
    return paths, names


def path_exists(token: str) -> bool | None:
    """True/False for a path of the repository's; None when it is no path of ours (its first
    folder is none of the repository's, e.g. an installed path)."""
    paths, folder_names = repo_paths()
    t, _, test = token.partition("::")  # a pytest node id: the file, then the test in it
    if "/" in t and t.split("/")[0] not in folder_names:
        return None
    t = t.rstrip("/")
    if "*" not in t and not test:
        return t in paths or any(p.endswith("/" + t) for p in paths)
    pattern = re.compile("(?:.*/)?" + re.escape(t).replace(r"\*", "[^/]*"))  # `bench_*.py`
    found = [p for p in paths if pattern.fullmatch(p)]
    if test:
        return any(
            re.search(rf"^(?:async )?def {re.escape(test)}\b", (REPO / p).read_text(), re.M) for p in found
        )
    return bool(found)


@cache
def herder_sources() -> dict[str, Path]:
    """Each herder module's full name -> its source file."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


@cache
def herder_modules() -> dict[str, list[str]]:
    """Each module's last name (`fleet`, `redis_side`) -> its full names."""
    out: dict[str, list[str]] = {}
    for full in herder_sources():
        out.setdefault(full.rsplit(".", 1)[-1], []).append(full)
    return out


@cache
def herder_classes() -> dict[str, list[tuple[str, str]]]:
    """Each class name defined in herder (ast, at any depth) -> (module, qualified name)."""
    out: dict[str, list[tuple[str, str]]] = {}

    def walk(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                qual = f"{prefix}{child.name}"
                out.setdefault(child.name, []).append((module, qual))
                walk(child, module, qual + ".")

    for module, path in herder_sources().items():
        walk(ast.parse(path.read_text()), module, "")
    return out


@cache
def self_stores(file: str) -> dict[str, set[str]]:
    """Each class of a source file -> the `self.x` it assigns."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(Path(file).read_text())):
        if isinstance(node, ast.ClassDef):
            out.setdefault(node.name, set()).update(
                sub.attr
                for sub in ast.walk(node)
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                if isinstance(sub.value, ast.Name) and sub.value.id == "self"
            )
    return out


def instance_attributes(cls: type) -> set[str]:
    """Attributes a class's instances get: annotations and `self.x = ...` in its (and its
    bases') source."""
    out: set[str] = set()
    for klass in cls.__mro__:
        out |= set(getattr(klass, "__annotations__", {}))
        file = getattr(sys.modules.get(klass.__module__), "__file__", None)
        if file and file.endswith(".py"):
            out |= self_stores(file).get(klass.__name__, set())
    return out


def has_path(obj: Any, attrs: list[str]) -> bool:
    for attr in attrs:
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif isinstance(obj, type) and attr in instance_attributes(obj):
            return attr == attrs[-1]  # an instance's value: nothing to look into further
        else:
            return False
    return True


@cache
def importable(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def resolve_qualified(parts: list[str]) -> bool:
    """An importable module's name, then attributes: `herder.supervisor.children.fleet.Slot`, `os._exit`."""
    for cut in range(len(parts), 0, -1):
        module = importable(".".join(parts[:cut]))
        if module is not None:
            return has_path(module, parts[cut:])
    return False


# Where a class herder's docs name and herder does not define comes from.
LIBRARY_CLASS_MODULES = (
    "builtins",
    "rq",
    "rq.job",
    "rq.queue",
    "rq.worker",
    "rq.registry",
    "rq.exceptions",
    "rq.timeouts",
    "rq.cron",
    "redis",
)


@cache
def service_keys() -> set[str]:
    """The keys of deploy/'s systemd unit and launchd plist templates."""
    text = "\n".join(p.read_text() for p in (REPO / "deploy").rglob("*.in"))
    return set(re.findall(r"^(\w+)=", text, re.M)) | set(re.findall(r"<key>(\w+)</key>", text))


def resolve_dotted(name: str) -> bool | None:
    """True/False for a code name; None when it is none (its head is no module nor class)."""
    head, *rest = name.split(".")
    if head == "herder":  # herder.pid, herder.log: the state dir's files
        return resolve_qualified(name.split(".")) if HERDER_NAME.fullmatch(name) else None
    if head in herder_modules():
        for full in herder_modules()[head]:
            module = importlib.import_module(full)
            if has_path(module, rest):
                return True
            # The instance convention: `pool.target` is a Pool's.
            named = [v for k, v in vars(module).items() if k.lower() == head and isinstance(v, type)]
            if any(has_path(cls, rest) for cls in named):
                return True
        return False
    if head in herder_classes():
        for module, qual in herder_classes()[head]:
            if has_path(importlib.import_module(module), [*qual.split("."), *rest]):
                return True
        return False
    if head[:1].isupper():
        classes = library_classes(head)
        if classes:
            return any(has_path(cls, rest) for cls in classes)
        # A key of the service files herder installs (`TimeoutStopSec`, `KeepAlive`).
        return not rest and head in service_keys()
    found = []
    if head in sys.stdlib_module_names or importable(head) is not None:
        found.append(resolve_qualified(name.split(".")))
    # The instance convention for a library's classes too: `queue.key` is an RQ Queue's.
    found += [has_path(cls, rest) for cls in library_classes(head.capitalize())]
    return any(found) if found else None


def library_classes(name: str) -> list[type]:
    return [
        getattr(m, name)
        for m in map(importable, LIBRARY_CLASS_MODULES)
        if isinstance(getattr(m, name, None), type)
    ]


@cache
def local_classes(path: str) -> dict[str, set[str]]:
    """The classes a Python file defines itself, each with its members (methods, class-level
    names, `self.x = ...`): a comment may name its own file's test helpers."""
    out: dict[str, set[str]] = {}
    for node in ast.parse((REPO / path).read_text()).body:
        if isinstance(node, ast.ClassDef):
            members = out.setdefault(node.name, set())
            for sub in ast.walk(node):
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    members.add(sub.name)
                elif isinstance(sub, ast.Name | ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    members.add(sub.id if isinstance(sub, ast.Name) else sub.attr)
    return out


def resolves_in(file: str, name: str) -> bool | None:
    head, *rest = name.split(".")
    if file.endswith(".py") and head in local_classes(file) and len(rest) <= 1:
        return not rest or rest[0] in local_classes(file)[head]
    return resolves(name)


@cache
def headings(page: str) -> list[str]:
    paths, _ = repo_paths()
    found = [p for p in paths if p == page or p.endswith("/" + page)]
    return [
        line.lstrip("#").strip().lower()
        for p in found
        for line in (REPO / p).read_text().splitlines()
        if line.startswith("#")
    ]


@cache
def resolves(name: str) -> bool | None:
    if name.endswith(FILE_EXTENSIONS) or "/" in name:
        return path_exists(name)
    return resolve_dotted(name)


def unresolved() -> list[tuple[str, str]]:
    out = []
    for where, name in references():
        if name not in ALLOWED and resolves_in(where.split(":")[0], name) is False:
            out.append((where, name))
    return out


def missing_sections() -> list[tuple[str, str]]:
    out = []
    for path in [*DOCS, *CODE]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for page, section in SECTION.findall(line):
                if not any(section.lower() in h for h in headings(page)):
                    out.append((f"{rel(path)}:{n}", f'{page}, "{section}"'))
    return out


@pytest.mark.slow
def test_every_named_module_class_function_and_file_exists() -> None:
    found = unresolved() + missing_sections()
    stale = [(where, name) for where, name in found if (where.split(":")[0], name) not in PENDING]
    for where, name in found:
        print(f"{where}: {name}{'  (PENDING)' if (where.split(':')[0], name) in PENDING else ''}")
    assert not stale, "names that resolve to nothing:\n" + "\n".join(f"{w}: {n}" for w, n in stale)
    fixed = PENDING - {(where.split(":")[0], name) for where, name in found}
    assert not fixed, f"fixed: remove these from PENDING: {sorted(fixed)}"


# ---- 3. the Redis side imports nothing of the master's ----------------------------------

REDIS_SIDE_MAY_IMPORT = ("herder.common", "herder.supervisor.redis_side", "rq", "redis")


def test_redis_side_imports_only_common_itself_rq_and_redis() -> None:
    """docs/design.md's map: supervisor/redis_side/ imports herder.common, itself, rq, redis."""
    wrong = []
    for path in sorted((REPO / "supervisor" / "redis_side").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["herder.supervisor.redis_side" if node.level else node.module or ""]
            for name in names:
                top = name.split(".")[0]
                ok = top in sys.stdlib_module_names or top == "__future__"
                ok = ok or any(name == p or name.startswith(p + ".") for p in REDIS_SIDE_MAY_IMPORT)
                if not ok:
                    wrong.append(f"{rel(path)}:{node.lineno}: {name}")
    assert not wrong, "supervisor/redis_side/ imports beyond its room: " + "; ".join(wrong)


# ---- 4. design.md's map is drawn from the folders ---------------------------------------


def map_rows() -> dict[str, str]:
    """docs/design.md's map of the code: folder -> its row's text."""
    rows = {}
    for line in (REPO / "docs" / "design.md").read_text().splitlines():
        if m := re.match(r"\| ((?:[\w]+/)+) \| herder\.", line):
            rows[m.group(1)] = line
    return rows


def test_design_maps_every_folder_of_the_code_and_names_each_module_in_its_own_row() -> None:
    rows = map_rows()
    missing = []
    for top in ("common", "watchdog", "worker", "supervisor"):
        for folder in [REPO / top, *sorted(p for p in (REPO / top).iterdir() if p.is_dir())]:
            modules = sorted(p.name for p in folder.glob("*.py") if p.name != "__init__.py")
            if not modules:
                continue
            key = str(folder.relative_to(REPO)) + "/"
            # A subfolder may sit in its parent's row.
            row = rows.get(key) or rows.get(key.rsplit("/", 2)[0] + "/", "")
            missing += [f"{key}{m}" for m in modules if f"`{m}`" not in row]
    assert not missing, f"modules docs/design.md's map does not name in their folder's row: {missing}"
