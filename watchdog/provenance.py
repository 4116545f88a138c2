"""Is each of herder's packages really herder's own?

`supervisor`, `worker` and `watchdog` are generic names: supervisord ships a
`supervisor` package, the file watcher on PyPI is `watchdog`, and users' job code
often has a `worker` module. If one of them shadows ours, herder must say so and stop,
not fail later with a confusing ImportError. Standard library only (the watchdog uses it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGES = ("supervisor", "worker", "watchdog")
EX_SOFTWARE = 70


def shadowed_packages() -> list[tuple[str, str]]:
    """(module, where it comes from) for each of herder's packages found elsewhere."""
    home = Path(__file__).resolve().parent.parent
    found = []
    for name in PACKAGES:
        module = sys.modules.get(name)
        origin = getattr(module, "__file__", None) if module else None
        if origin is None:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec else None
        if origin is None or Path(origin).resolve().parent.parent != home:
            found.append((name, str(origin)))
    return found


def exit_if_shadowed() -> None:
    problems = shadowed_packages()
    if problems:
        for name, origin in problems:
            print(
                f"herder: the module {name!r} is imported from {origin}, not from herder's installation "
                f"({Path(__file__).resolve().parent.parent}); another package or a local directory "
                f"named {name!r} shadows it. Rename or uninstall it, or fix PYTHONPATH.",
                file=sys.stderr,
            )
        sys.exit(EX_SOFTWARE)
