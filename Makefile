# The README's two commands: `make demo` and `make test`. Each sets up .venv/ itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PACKAGE_FILES := $(shell find slicekeeper operator supervisor workload -name '*.py' 2>/dev/null) pyproject.toml
PYTEST_ARGS ?=
CHROMIUM := /usr/bin/chromium

.PHONY: demo test install lint typecheck layers crds dashboards clean bench system-tools

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

# The CRD, generated from the models, for kubectl (crds/) and for the chart (its crds/ folder).
crds: install
	$(BIN)/slicekeeper crd > crds/trainingjob.yaml
	cp crds/trainingjob.yaml charts/slicekeeper/crds/trainingjob.yaml

# What the tests need from outside PyPI, installed once, when missing (apt-get needs root; CI's is):
# - Debian's prometheus (server and promtool): the rules and dashboards are checked against a real
#   Prometheus;
# - Debian's chromium: the run's page is opened in it (Playwright drives it; it never downloads one);
# - Debian's nftables: chaos `partition` drops a machine's packets with its rules;
# - from npm, the Prometheus Operator's CRD schemas with their validation, under .venv/node: the
#   chart's PodMonitor and PrometheusRule objects are checked against them.
PROMETHEUS_OPERATOR_MODELS := @kubernetes-models/prometheus-operator@6.0.0
system-tools:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null && test -x $(CHROMIUM) \
		&& command -v nft >/dev/null || { \
		echo "installing Debian's prometheus, chromium and nftables packages for the tests"; \
		(apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus chromium nftables; }
	@test -d $(VENV)/node/node_modules/@kubernetes-models/prometheus-operator || { \
		echo "installing $(PROMETHEUS_OPERATOR_MODELS) under $(VENV)/node for the tests"; \
		npm install --prefix $(VENV)/node --no-audit --no-fund --silent $(PROMETHEUS_OPERATOR_MODELS); }

# The chart's Grafana dashboards, generated from slicekeeper/dashboards (a test fails when stale).
dashboards: install
	$(BIN)/python -m slicekeeper.dashboards charts/slicekeeper/dashboards

# Three pytest-xdist workers (one more than this machine's cores: a run's waits leave room for a
# third), each file on one worker, long light files first (tests/support/file_order.py); at most
# two `heavy` tests at once (tests/support/alone.py). `make test TEST_WORKERS=0` runs it in one pytest process (docs/testing.md).
TEST_WORKERS ?= 3
XDIST_ARGS := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: lint typecheck layers system-tools
	$(BIN)/pytest --durations=25 $(XDIST_ARGS) $(PYTEST_ARGS)

bench: install
	$(BIN)/python benchmarks/recovery.py
	$(BIN)/python benchmarks/handover.py --fault lose
	$(BIN)/python benchmarks/handover.py --fault crash-supervisor
	$(BIN)/python benchmarks/checkpoint.py
	$(BIN)/python benchmarks/policy.py
	$(BIN)/python benchmarks/layout.py
	$(BIN)/python benchmarks/export.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
