"""The bottom of herder's import graph: standard library only, imported by the watchdog, the
master, the workers and the CLI alike (protocol formats, the configuration schema, exit
descriptions). Installed as `herder.common`."""
