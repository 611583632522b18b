"""Benchmarks and the evaluation harness (`python -m bench run`, `python -m bench eval`).

- `__main__`, `cli`, `run`, `report`: the commands, the full run and BENCHMARKS.md from its results (`results/`).
- `dataset`, `loader`, `services`, `catchup`, `machine`: the data, publishing it, the processes, waiting, the host.
- `raw`, `lag`, `latency`, `profile`, `replay`: the measurements of a run.
- `eval`, `conversations` (with `data/`): retrieval quality; `agent`, `access`, `crypto`, `embedding`, `stats`,
  `workers`: one question each.
"""

import os

# every benchmark, `python -m bench X` and `python -m bench.X` alike, runs on the development stack: the package
# runs before any of its modules reads the settings (producers.settings refuses the development key otherwise)
os.environ.setdefault("LEDGER_DEVELOPMENT", "1")
