"""herder's master: spawns, watches, scales and stops RQ workers; and the CLI."""

# herder's version, in this one place: setup.py reads it from here when it builds (pyproject's
# version is dynamic) and adds the commit to a development version (0.2.0.dev0+g1a2b3c4d5e6f);
# `herder --version` prints the whole (herder.supervisor.ctl.version). A plain string, no imports,
# so the build reads it without importing anything and the CLI pays nothing for it. A release sets
# it to the release number (no .dev) and names CHANGELOG.md's top section after it.
__version__ = "0.2.0.dev0"
