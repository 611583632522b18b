"""Benchmarks and the evaluation harness (`python -m bench run`, `ledger eval`)."""
