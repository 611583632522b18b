# The two commands a newcomer needs: `make demo` and `make test`. Everything else is a step of those.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# the local stack uses the development API key and PostgreSQL password; a deployment never sets this
export LEDGER_DEVELOPMENT ?= 1

.PHONY: install up down status test demo lint bench

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[dev]"
	touch $@

# the MCP Inspector's CLI (an independent MCP client, tests/test_mcp_inspector.py): npm, at the lock's versions
INSPECTOR := tests/mcp_inspector
$(INSPECTOR)/node_modules/.installed: $(INSPECTOR)/package.json $(INSPECTOR)/package-lock.json
	npm ci --prefix $(INSPECTOR) --no-audit --no-fund --loglevel=error
	touch $@

install: $(VENV)/.installed $(INSPECTOR)/node_modules/.installed

up: install
	$(PY) -m infra up

down:
	$(PY) -m infra down

status:
	$(PY) -m infra status

test: up
	@# the fault suite stops and starts servers: the demo's own processes must not be connected to them
	$(PY) -m infra down worker indexer embedder api mcp
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

demo: install
	$(PY) -m infra up --service
	$(VENV)/bin/ledger demo

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports
