"""Installs, starts, stops and reports on memory-ledger's own stack (see `python -m infra --help`)."""
