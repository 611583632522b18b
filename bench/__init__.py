"""Benchmarks and the evaluation harness (`python -m bench run`, `python -m bench eval`)."""
