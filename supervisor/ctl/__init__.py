"""The operator side: the `herder` command, the control client, status rendering and
service files. Runs in the operator's process, never in the master."""
