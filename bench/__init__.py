"""Benchmarks and the evaluation harness (`python -m bench run`, `python -m bench eval`).

- `__main__`, `cli`, `run`, `report`: the commands, the full run and BENCHMARKS.md from its results (`results/`).
- `dataset`, `loader`, `services`, `catchup`, `machine`: the data, publishing it, the processes, waiting, the host.
- `raw`, `lag`, `latency`, `profile`, `replay`: the measurements of a run.
- `eval`, `conversations` (with `data/`): retrieval quality; `agent`, `access`, `crypto`, `embedding`, `stats`,
  `workers`: one question each.
"""
