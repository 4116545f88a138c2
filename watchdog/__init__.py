"""herder's watchdog: restarts the master. Standard library only, on purpose."""
