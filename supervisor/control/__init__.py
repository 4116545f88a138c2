"""The control surface: the control socket's server (`server.py`, peer check in
`peercred.py`), what each request does (`commands.py`, `reload.py`), and the HTTP endpoint
(`http_endpoint.py`, its token check in `http_auth.py`) that serves the views. A new command
belongs here; what it shows belongs in views/."""
