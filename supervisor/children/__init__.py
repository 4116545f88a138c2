"""The children and their pipes: the master's records of its workers (`fleet.py`, `states.py`,
`observations.py`), how one is started (`launcher.py`, `launchers.py`, `forkserver.py`,
`workerproc.py`), read (`pipes.py`, `dispatchers.py`, `logs.py`) and counted (`counters.py`),
one child's life (`lifecycle.py`), and the loop's two hands on them: `spawner.py` and
`reaper.py`. RQ's scheduler process is a child too (`scheduler.py`)."""
