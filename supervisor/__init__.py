"""herder's master: spawns, watches, scales and stops RQ workers; and the CLI."""

__version__ = "0.1.0"
