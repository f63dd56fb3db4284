# Multi-device training side by side: PyTorch, JAX, MXNet.
#   make compare                          the main job: every framework x workload, then the report
#   make test                             every test suite, each in its framework's environment
#   make numerics [NUMERICS_ISAS=AVX2]    the numerics tests, natively and with the ISA capped
#   make bench FRAMEWORK=jax GPUS=2 [WORKLOAD=lenet] [PRESET=cpu] [PLATFORM=auto] [STRATEGY=...]
#   make report | readme-tables | setup [FRAMEWORK=..] | lint | info | clean

SHELL := /bin/bash
PYTHON ?= python3.11
FRAMEWORKS := torch jax mxnet
WORKLOADS := lenet resnet18 resnet50
VENV := .venv
GPUS ?= 1
PLATFORM ?= auto
WORKLOAD ?= all
RESULTS ?= results/results.jsonl
REPORTS ?= reports
PIP_FLAGS ?= --quiet --disable-pip-version-check

# Which framework environments a target works on: FRAMEWORK=x, or all three.
ifdef FRAMEWORK
  ifeq ($(filter $(FRAMEWORK),$(FRAMEWORKS)),)
    $(error unknown FRAMEWORK '$(FRAMEWORK)'; choose one of: $(FRAMEWORKS))
  endif
  SELECTED := $(FRAMEWORK)
else
  SELECTED := $(FRAMEWORKS)
endif
ifneq ($(WORKLOAD),all)
  ifeq ($(filter $(WORKLOAD),$(WORKLOADS)),)
    $(error unknown WORKLOAD '$(WORKLOAD)'; choose one of: $(WORKLOADS) all)
  endif
  BENCH_WORKLOADS := $(WORKLOAD)
else
  BENCH_WORKLOADS := $(WORKLOADS)
endif

.PHONY: setup test numerics mutants bench report compare lint format info clean

# --- environments: base (common, compare, lint) + one per framework (docs/design.md, "Environments") ------
# A stamp per environment, newer than pyproject.toml: re-running setup is a no-op.
$(VENV)/%/.stamp: pyproject.toml
	@echo "== setting up $(VENV)/$* (first time: minutes; torch brings several GB of CUDA wheels)"
	@test -x $(VENV)/$*/bin/python || $(PYTHON) -m venv $(VENV)/$*
	@if [ "$*" = base ]; then extras=dev; else extras=$*,dev; fi; \
	  if [ "$*" = jax ] && command -v nvidia-smi >/dev/null; then extras=jax-cuda,dev; fi; \
	  set -o pipefail; $(VENV)/$*/bin/pip install $(PIP_FLAGS) -e ".[$$extras]" 2>&1 \
	  | { grep -v 'is neither a file nor a directory' || true; }
	@touch $@

setup: $(VENV)/base/.stamp $(foreach f,$(SELECTED),$(VENV)/$(f)/.stamp)

# --- tests: framework-free suites in base (numpy 2) and again in mxnet (numpy 1.23); each
# framework's suite in its own environment
test: setup
	@status=0; \
	run() { echo "== pytest in $(VENV)/$$1: $${@:2}"; $(VENV)/$$1/bin/python -m pytest -q "$${@:2}"; rc=$$?; \
	        if [ $$rc -ne 0 ]; then echo "== FAILED in $$1 (exit $$rc)"; status=1; fi; }; \
	run base tests/common tests/compare; \
	for f in $(SELECTED); do \
	  if [ $$f = mxnet ]; then run $$f tests/common tests/compare tests/$${f}_impl; else run $$f tests/$${f}_impl; fi; \
	done; \
	exit $$status

# --- numerics: the tests marked `numerics` (tests/fixtures/numerics.py), natively and with the CPU
# instruction set capped at AVX2, so an AVX-512 machine also runs what an AVX2 machine runs
# (oneDNN in torch, MKLDNN in MXNet, XLA:CPU in JAX each pick kernels by instruction set).
NUMERICS_ISAS ?= native AVX2
ISA_CAP = ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 XLA_FLAGS="$$XLA_FLAGS --xla_cpu_max_isa=AVX2"
numerics: setup
	@status=0; \
	for isa in $(NUMERICS_ISAS); do \
	  for f in $(SELECTED); do \
	    echo "== numerics in $(VENV)/$$f, ISA $$isa"; \
	    ( if [ $$isa = AVX2 ]; then export $(ISA_CAP); fi; \
	      $(VENV)/$$f/bin/python -m pytest -q -m numerics tests/$${f}_impl ) \
	      || { echo "== FAILED: numerics in $$f, ISA $$isa"; status=1; }; \
	  done; \
	done; \
	exit $$status

# Planted bugs: each numerics test must fail on its mutant (tests/numerics_mutants.py; minutes).
mutants: setup
	$(VENV)/base/bin/python -m tests.numerics_mutants $(if $(ISA),--isa $(ISA))

# --- one benchmark run per workload, appending to $(RESULTS) ------------------------------------
bench:
ifndef FRAMEWORK
	$(error bench needs FRAMEWORK=<one of: $(FRAMEWORKS)>, e.g. make bench FRAMEWORK=jax GPUS=2)
endif
	@$(MAKE) --no-print-directory setup FRAMEWORK=$(FRAMEWORK)
	@for w in $(BENCH_WORKLOADS); do \
	  $(VENV)/$(FRAMEWORK)/bin/python -m $(FRAMEWORK)_impl --workload $$w --gpus $(GPUS) \
	    --platform $(PLATFORM) --results $(RESULTS) \
	    $(if $(PRESET),--preset $(PRESET)) $(if $(STRATEGY),--strategy $(STRATEGY)) $(ARGS) || exit $$?; \
	done

report: $(VENV)/base/.stamp
	$(VENV)/base/bin/python -m compare.report --results $(RESULTS) --out $(REPORTS) --html

# The README's reference tables, rewritten from the committed records in results/ (a test fails
# when they differ: tests/compare/test_readme.py).
.PHONY: readme-tables
readme-tables: $(VENV)/base/.stamp
	$(VENV)/base/bin/python -m compare.readme

# The main job: sets up what is missing, runs everything at the preset that fits the machine.
compare: setup
	$(VENV)/base/bin/python -m compare.run --frameworks $(SELECTED) --workloads $(BENCH_WORKLOADS) \
	  --results $(RESULTS) --out $(REPORTS) $(if $(PRESET),--preset $(PRESET)) --platform $(PLATFORM) --html

lint: $(VENV)/base/.stamp
	$(VENV)/base/bin/ruff check .
	$(VENV)/base/bin/ruff format --check .

format: $(VENV)/base/.stamp
	$(VENV)/base/bin/ruff format .
	$(VENV)/base/bin/ruff check --fix .

# The hardware review, like the nvidia-smi step of the tutorials: CPU, GPUs, what each framework sees.
info: $(VENV)/base/.stamp
	@$(VENV)/base/bin/python -m common.info
	@for f in $(SELECTED); do \
	  if [ -x $(VENV)/$$f/bin/python ]; then $(VENV)/$$f/bin/python -m $${f}_impl.info; \
	  else echo "$$f: environment not set up (make setup FRAMEWORK=$$f)"; fi; \
	done

clean:
	rm -rf $(REPORTS) .pytest_cache .ruff_cache
