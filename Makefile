# fusetile: one-command set-up, tests and demo. `make help` lists the targets.

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
STAMP       := $(VENV)/.fusetile-installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist): one per CPU. The simulation models are built once
# and shared (a lock per model), so the workers only share the CPUs.
PYTEST_WORKERS ?= auto

.DEFAULT_GOAL := help
BOARD       ?= ulx3s-85f
CLOCK_MHZ   ?=
FPGA_STAMP  := $(VENV)/.fusetile-fpga-installed

.PHONY: help venv fpga-tools test sim bitstream test-fpga clean

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
	$(VPY) -m pytest tests/ -m "not slow" -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

sim: venv ## The demo: digits CNN on the Verilator RTL under none, static, adaptive (+ plots)
	$(VENV)/bin/fusetile demo --target verilator

# The YoWASP tools (the `fpga` extra), only for the targets that build bitstreams.
$(FPGA_STAMP): pyproject.toml | $(STAMP)
	$(VPY) -m pip install -e '.[dev,fpga]'
	@touch $@

fpga-tools: $(FPGA_STAMP) ## Install the open FPGA tools (YoWASP Yosys, nextpnr) into .venv

bitstream: venv fpga-tools ## Build the bitstream for BOARD (ulx3s-85f or icebreaker) [at CLOCK_MHZ] [best of SEEDS placements] [each stopped after TIME_LIMIT minutes] and report it
	$(VENV)/bin/fusetile build --board $(BOARD) $(if $(CLOCK_MHZ),--clock-mhz $(CLOCK_MHZ)) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(TIME_LIMIT),--time-limit $(TIME_LIMIT))

test-fpga: venv fpga-tools ## Long runs (bitstreams, big sweeps): pytest -m slow
	$(VPY) -m pytest tests/ -m slow $(PYTEST_ARGS)

clean: ## Remove build products (simulation models, caches); keeps .venv
	rm -rf build sim_build results.xml .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
