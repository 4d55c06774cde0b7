"""Developer tools run by `make check` (not part of the server)."""
