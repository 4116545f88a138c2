"""herder's master: spawns, watches, scales and stops RQ workers; and the CLI."""

# herder's version, in this one place: pyproject.toml reads it from here when it builds (its
# version is dynamic), and `herder --version` prints it. A plain string, no imports, so setuptools
# reads it without importing anything and the CLI pays nothing for it.
__version__ = "0.1.0"
