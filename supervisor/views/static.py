"""The dashboard's files: the page and what it loads, from this package's static/ folder
only (written by the page's own build, not here). A name is looked up in a fixed list of
the folder's files, never joined to a path a client sent, so nothing outside it is served."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "static"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
    ".txt": "text/plain; charset=utf-8",
    ".map": "application/json",
}
PLAIN = "text/plain; charset=utf-8"  # LICENSE-uplot and other names without a known suffix
MAX_FILE = 4 * 1024 * 1024  # bytes: a file bigger than this is not the page's
NO_PAGE = (
    b"<!doctype html><meta charset=utf-8><title>herder</title>"
    b"<p>herder's dashboard page is not installed here; its data is at /api/snapshot.</p>\n"
)


def files(folder: Path = FOLDER) -> dict[str, Path]:
    """The folder's regular files by name (no subfolders, no hidden files)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return {}
    return {p.name: p for p in entries if p.is_file() and not p.name.startswith(".")}


def read(name: str, folder: Path = FOLDER) -> tuple[bytes, str] | None:
    """(body, content type) of the folder's file `name`, or None: no such file."""
    path = files(folder).get(name)
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_FILE:
            return None
        body = path.read_bytes()
    except OSError:
        return None
    return body, TYPES.get(path.suffix.lower(), PLAIN)


def page(folder: Path = FOLDER) -> tuple[int, bytes, str]:
    """GET /: index.html, or a small page saying it is missing (404)."""
    found = read("index.html", folder)
    if found is None:
        return 404, NO_PAGE, TYPES[".html"]
    return 200, *found
