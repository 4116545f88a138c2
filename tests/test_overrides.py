"""Each RQ worker method herder changes is overridden in exactly one of herder's classes, so a
reader following one job finds each step in one place (worker/rq_worker.py's story). Unit tests
of the classes alone: no Redis, no process."""

from __future__ import annotations

import pytest
from rq.worker import BaseWorker, SimpleWorker, Worker

from herder.worker.fast_path.worker import HerderFastWorker
from herder.worker.rq_worker import HerderMixin, herder_worker_class


def rq_methods(cls: type) -> set[str]:
    """Every method (and property) RQ's classes in `cls`'s MRO define."""
    return {
        name
        for klass in cls.__mro__
        if klass.__module__.startswith("rq.")
        for name, value in vars(klass).items()
        if callable(value) or isinstance(value, (property, staticmethod, classmethod))
    }


def overrides(cls: type) -> dict[str, list[str]]:
    """For each RQ method some class of `cls`'s other than RQ's own defines: those classes."""
    rq = rq_methods(cls)
    found: dict[str, list[str]] = {}
    for klass in cls.__mro__:
        if klass.__module__.startswith("rq.") or klass is object:
            continue
        for name in vars(klass):
            if name in rq:
                found.setdefault(name, []).append(klass.__qualname__)
    return found


WORKERS = [HerderFastWorker, herder_worker_class(SimpleWorker), herder_worker_class(Worker)]


@pytest.mark.parametrize("cls", WORKERS, ids=lambda c: c.__name__)
def test_each_rq_method_herder_overrides_is_overridden_once(cls: type[BaseWorker]) -> None:
    twice = {name: where for name, where in overrides(cls).items() if len(where) > 1}
    assert not twice, f"RQ methods overridden in more than one of herder's classes: {twice}"


def test_herders_worker_overrides_the_same_rq_methods_on_every_rq_class() -> None:
    """A user's class (SimpleWorker's or Worker's) gets the same overrides as herder's own."""
    # Less the fast worker's constructor, which gives it its fast path.
    assert len({frozenset(overrides(cls)) - {"__init__"} for cls in WORKERS}) == 1
    assert "dequeue_job_and_maintain_ttl" in overrides(HerderFastWorker)  # the rule sees the mixins


def test_the_rule_catches_a_second_override() -> None:
    class Again(HerderMixin):
        def heartbeat(self, *args: object, **kwargs: object) -> None:  # also in herder's own
            super().heartbeat(*args, **kwargs)

    worker = type("Twice", (Again, SimpleWorker), {})
    assert overrides(worker)["heartbeat"][:1] == ["test_the_rule_catches_a_second_override.<locals>.Again"]
    assert len(overrides(worker)["heartbeat"]) == 2
