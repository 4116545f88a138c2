"""Decisions: a pool and its plan (`pool.py`), how many workers (`scaling.py`, pure, and
`autoscaler.py`), who retires (`retirement.py`), who is hung and may be killed (`liveness.py`,
pure; `guard.py`; `murder.py` carries the verdicts out), when memory forbids growth
(`pressure.py`), and who ends a job herder gave up on (`endings.py`). A new kill reason, a new
pool rule or a new scaling input belongs here."""
