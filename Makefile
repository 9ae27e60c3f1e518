# fusetile: one-command set-up, tests and demo. `make help` lists the targets.

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
STAMP       := $(VENV)/.fusetile-installed
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv test sim test-fpga clean

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: $(STAMP) ## Create .venv, install fusetile[dev] and Icarus (as root), check the simulators
	@bash scripts/install_iverilog.sh
	@$(VPY) scripts/check_simulators.py

$(VPY):
	$(PYTHON) -m venv $(VENV)

# Reinstalled only when pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -e '.[dev]'
	@touch $@

test: venv ## Run all tests: unit tests and the cocotb RTL regression on Icarus and Verilator
	$(VPY) -m pytest tests/ -m "not slow" $(PYTEST_ARGS)

sim: venv ## The demo: digits CNN on the Verilator RTL under none, static, adaptive (+ plots)
	$(VENV)/bin/fusetile demo --target verilator

test-fpga: venv ## Long runs (bitstreams, big sweeps): pytest -m slow
	$(VPY) -m pytest tests/ -m slow $(PYTEST_ARGS)

clean: ## Remove build products (simulation models, caches); keeps .venv
	rm -rf build sim_build results.xml .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
