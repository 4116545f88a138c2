"""herder's RQ worker: runs jobs in process and speaks the line protocol on stdout."""
