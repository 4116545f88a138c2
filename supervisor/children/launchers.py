"""One launcher per set of imports: pools that agree on their paths and preloads share a fork
server (what its template imports); a pool that differs gets one of its own, made on its first
spawn. Without a factory every pool shares the first launcher (unit tests, --no-fork-server)."""

from __future__ import annotations

from collections.abc import Callable

from herder.common.config import Config
from herder.supervisor.children.launcher import Launcher
from herder.supervisor.policy.pool import Pool


class Launchers:
    def __init__(self, first: Launcher, cfg: Config, new: Callable[[Config], Launcher] | None = None) -> None:
        """`first`: the launcher for `cfg`'s imports; `new`: makes one for other imports."""
        self.by_imports: dict[tuple[tuple[str, ...], tuple[str, ...]], Launcher] = {
            (tuple(cfg.paths), tuple(cfg.preload)): first
        }
        self.new = new

    @property
    def first(self) -> Launcher:
        return next(iter(self.by_imports.values()))

    def for_pool(self, pool: Pool, wake: Callable[[], None]) -> Launcher:
        """The pool's launcher, made now if its imports are new (its template starts importing)."""
        key = pool.launch_key
        if key not in self.by_imports:
            if self.new is None:
                return self.first
            self.by_imports[key] = self.new(pool.cfg)
            self.by_imports[key].tend(wake)
        return self.by_imports[key]

    def all(self) -> list[Launcher]:
        return list(self.by_imports.values())
