"""The ``runnerd`` command: the root parser (main), local commands, admin commands on the
data dir, client commands over HTTP, and output helpers."""
