"""The thin HTTP service: recall, facts, history, audit replay, publish (see api/main.py)."""
