"""Memory of an idle pool: each worker's USS and RSS, the supervising process's, and the rest.

USS (psutil's memory_full_info().uss) is the memory only that process holds: what it would
give back if it exited. RSS also counts pages it shares (libraries, pages inherited from a
forking parent), so RSS summed over a pool overstates it. Pages a forked worker still shares
with its parent or siblings count in no one's USS, so USS summed over a forked pool understates
it. PSS splits each shared page among the processes that map it: PSS summed over a pool is
the fairest total (pages shared with processes outside the pool, libc's, are split with them).
"""

from __future__ import annotations

import contextlib

import psutil

from bench_base import median

MB = 1024 * 1024


def pool_memory(top_pid: int, master: psutil.Process | None, workers: dict[int, psutil.Process]) -> dict:
    """MB figures for one idle pool; `top_pid` is the pool's top process (herder's watchdog)."""
    uss, pss, rss = [], [], []
    for p in workers.values():
        with contextlib.suppress(psutil.Error):
            m = p.memory_full_info()
            uss.append(m.uss / MB)
            pss.append(m.pss / MB)
            rss.append(m.rss / MB)
    out = {
        "worker_uss": median(uss),
        "worker_pss": median(pss),
        "worker_rss": median(rss),
        "sup_rss": float("nan"),
        "sup_uss": float("nan"),
        "sup_threads": 0,
        "others": 0,
        "others_uss": 0.0,
        "tree_uss": sum(uss),
        "tree_pss": sum(pss),
    }
    if master is not None:
        with contextlib.suppress(psutil.Error):
            m = master.memory_full_info()
            out.update(sup_rss=m.rss / MB, sup_uss=m.uss / MB, sup_threads=master.num_threads())
            out["tree_uss"] += m.uss / MB
            out["tree_pss"] += m.pss / MB
    with contextlib.suppress(psutil.Error):
        top = psutil.Process(top_pid)
        skip = set(workers) | ({master.pid} if master else set())
        for p in [top, *top.children(recursive=True)]:
            if p.pid in skip:
                continue
            with contextlib.suppress(psutil.Error):
                m = p.memory_full_info()
                out["others"] += 1
                out["others_uss"] += m.uss / MB
                out["tree_uss"] += m.uss / MB
                out["tree_pss"] += m.pss / MB
    return out
