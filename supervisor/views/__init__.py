"""What the master shows: one frozen snapshot of the host, published by the loop
(`model.HostSnapshot`, built by `build.py`), its history (`history.py`: 15 minutes at 1 s)
and its events (`journal.py`), and every renderer of them: the dashboard's JSON (`api.py`)
and its files (`static.py`, the page in `static/`); the judgements they show (`health.py`),
per-function job metrics (`jobstats.py`), and the pushes to people (`hooks.py`). A new
dashboard panel, metric or status field belongs here."""
