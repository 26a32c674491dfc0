# The README's two commands: `make demo` and `make test`. Each sets up .venv/ itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PACKAGE_FILES := $(shell find slicekeeper operator supervisor workload -name '*.py' 2>/dev/null) pyproject.toml
PYTEST_ARGS ?=
CHROMIUM := /usr/bin/chromium

.PHONY: demo test install lint typecheck layers crds clean bench chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel

# Dependencies once; the package itself as a strict editable install (a link tree mypy can read),
# refreshed whenever a package file changes (new modules need new links).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	touch $(STAMP)

$(VENV)/.linked: $(STAMP) $(PACKAGE_FILES)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e . --config-settings editable_mode=strict
	touch $(VENV)/.linked

install: $(VENV)/.linked

# Writes demo-report.json and the page demo-report.html beside it (both paths printed at the end).
demo: install
	$(BIN)/slicekeeper run examples/trainingjob.yaml --steps 600 \
		--chaos "kill:host=1@step=150,lose:host=0@step=300,hang:host=0@step=450" --report demo-report.json

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy reads the installed link tree (from the repo root it would see only the core folder).
typecheck: install
	cd $(VENV) && bin/mypy --config-file ../pyproject.toml -p slicekeeper

layers: install
	$(BIN)/lint-imports

crds: install
	$(BIN)/slicekeeper crd > crds/trainingjob.yaml

# The browser the run's page is opened in by its test (tests/integration/test_report_page_in_a_browser.py):
# Debian's Chromium, installed only when missing (as root; Playwright never downloads one).
$(CHROMIUM):
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

chromium: $(CHROMIUM)

test: lint typecheck layers chromium
	$(BIN)/pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python benchmarks/recovery.py
	$(BIN)/python benchmarks/handover.py --fault lose
	$(BIN)/python benchmarks/handover.py --fault crash-supervisor
	$(BIN)/python benchmarks/checkpoint.py
	$(BIN)/python benchmarks/policy.py
	$(BIN)/python benchmarks/layout.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
