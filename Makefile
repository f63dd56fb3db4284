# Multi-device training side by side: PyTorch, JAX, MXNet.
#   make compare                          the main job: every framework x workload, then the report
#   make test | test-slow | test-all     the fast tier (not slow), the rest, both; test-gpu: GPU tier
#   make numerics [NUMERICS_ISAS=AVX2]    the numerics tests, natively and with the ISA capped
#   make bench FRAMEWORK=jax GPUS=2 [WORKLOAD=lenet] [PRESET=cpu] [PLATFORM=auto] [STRATEGY=...]
#   make ceiling [FRAMEWORK=jax] [WORKLOAD=lenet] [PRESET=cpu] [RESULTS=..]   the framework's own
#                                         tight-loop step of lenet and resnet18 on 1 device (GPUS ignored)
#   make cluster [FRAMEWORK=..] [NODES="1 2"] [LINKS="unlimited 1gbit"]   nodes in network namespaces
#   make collectives [FRAMEWORK=..] [RANKS="2 4 8"] [LINKS=..]   each engine's all-reduce alone
#   make report | readme-tables | docs | setup [FRAMEWORK=..] | lock [UPGRADE=1] | lint | info | clean

override SHELL := /bin/bash
override FRAMEWORKS := torch jax mxnet
override WORKLOADS := lenet resnet18 resnet50 zero
VENV := .venv
GPUS ?= 1
PLATFORM ?= auto
WORKLOAD ?= all
RESULTS ?= results/results.jsonl
REPORTS ?= reports
PIP_FLAGS ?= --quiet --disable-pip-version-check
# The machine's Python, used for every environment whose lock supports it (tools/venv.sh).
PYTHON ?= python3
UV_VERSION := 0.13.9
UV ?= $(VENV)/tools/bin/uv
GPU_PYTHON ?=
NUMERICS_ISAS ?= native AVX2

# --- what a user gives, checked as the Makefile is read ------------------------------------------
# A value reaches a recipe as environment ($$NAME there, quoted or split into words), or, where
# make itself must write it into a recipe (a name, a path, a list of options), only once it is
# checked here: one word (or a list of words) of the characters below, or one of the names a
# setting takes. Anything else, shell text among it, is refused in one line before any recipe
# runs, `make -n` included (which runs the lines that call $(MAKE)). A `$` in a value given on
# make's command line is refused too: make expands such a value as it hands it to a recipe. The
# Makefile's own lists and recipe pieces are `override`: a command line cannot replace them.
override WORD_CHARS := a b c d e f g h i j k l m n o p q r s t u v w x y z \
  A B C D E F G H I J K L M N O P Q R S T U V W X Y Z 0 1 2 3 4 5 6 7 8 9 . _ / + - = : , @ %
override empty :=
override space := $(empty) $(empty)
# $(1) less every character listed in $(2).
override without = $(if $(2),$(call without,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
# Whether variable $(1) came from the user (make's command line or the environment): the
# Makefile's own defaults are not checked.
override given = $(filter command line environment environment override,$(origin $(1)))
# Whether variable $(1)'s text as given (never expanded: a `$(shell ...)` in it runs nothing) is
# a number of words that $(2) allows (`1`, `0 1`, or `any`), each of WORD_CHARS only.
override words_ok = $(and $(if $(filter any,$(2)),ok,$(filter $(2),$(words $(value $(1))))),$(if $(call without,$(subst $(space),,$(value $(1))),$(WORD_CHARS)),,ok))
override need_words = $(if $(call given,$(1)),$(if $(call words_ok,$(1),$(2)),,$(error $(1)='$(value $(1))' is not $(3): letters, digits and ._/+-=:,@% only, no spaces or shell text)))
# Variable $(1) is one of the words $(2), or unset where $(3) says `optional`.
override one_of = $(and $(filter 1,$(words $(value $(1)))),$(filter $(2),$(value $(1))))
override need_one_of = $(if $(call given,$(1)),$(if $(or $(call one_of,$(1),$(2)),$(and $(3),$(if $(strip $(value $(1))),,ok))),,$(error unknown $(1) '$(value $(1))'; choose one of: $(2))))
$(foreach v,$(.VARIABLES),$(if $(and $(filter command line,$(origin $(v))),$(findstring $$,$(value $(v)))),$(error $(v)='$(value $(v))': a `$$` in a value given to make would run as make text; give it without)))
$(call need_words,VENV,1,one path)
$(call need_words,PYTHON,1,one command or path)
$(call need_words,UV,0 1,one command or path (or empty: no uv))
$(call need_words,GPU_PYTHON,0 1,one command or path)
$(call need_words,UV_VERSION,1,one version)
$(call need_words,PIP_FLAGS,any,a list of pip options)
$(call need_words,MAKE,1,one command or path)
$(call need_words,UPGRADE,0 1,one word (UPGRADE=1))
$(call need_one_of,FRAMEWORK,$(FRAMEWORKS),optional)
$(call need_one_of,WORKLOAD,$(WORKLOADS) all)
$(call need_one_of,ISA,AVX2,optional)
$(foreach isa,$(if $(call given,NUMERICS_ISAS),$(value NUMERICS_ISAS)),$(if $(filter native AVX2,$(isa)),,$(error NUMERICS_ISAS='$(value NUMERICS_ISAS)' holds '$(isa)': give native, AVX2 or both)))

# Which framework environments a target works on: FRAMEWORK=x, or all three.
override SELECTED := $(or $(strip $(FRAMEWORK)),$(FRAMEWORKS))
override BENCH_WORKLOADS := $(if $(filter all,$(WORKLOAD)),$(WORKLOADS),$(strip $(WORKLOAD)))

.PHONY: setup test numerics mutants bench ceiling report compare lint format info clean

# --- environments: base (common, compare, lint) + one per framework (docs/design.md, "Environments") ------
# Each is installed from its lock file in locks/ (`make lock` writes them), so every machine gets the
# same versions as the committed results. The Pythons each lock is made for: the locked numpy 2.4
# and flax 0.12 need 3.11+; MXNet's numpy 1.23.5 has wheels for 3.10 and 3.11 only.
override PYTHONS := 3.11 3.12 3.13
override PYTHONS_mxnet := 3.10 3.11
override pythons = $(or $(PYTHONS_$(1)),$(PYTHONS))
# JAX with CUDA plugins where nvidia-smi is found.
override JAX_LOCK := $(if $(shell command -v nvidia-smi),jax-cuda,jax)
override lock_of = locks/$(if $(filter jax,$(1)),$(JAX_LOCK),$(1)).txt

# uv makes the environments; a pinned copy in its own venv, since Debian's pip refuses --user
# installs (UV_VERSION). UV=uv uses the one on PATH; without uv, tools/venv.sh uses venv + pip
# (same locks). (The grep drops pip's warning per package missing from a file:// index in pip.conf.)
# (tools/venv.sh --check-python: a PYTHON given that does not run is an error here, not a setup
# that goes on without uv, on another Python)
$(VENV)/tools/bin/uv:
	@PYTHON=$(PYTHON) tools/venv.sh --check-python
	@echo "== installing uv $(UV_VERSION) into $(VENV)/tools"
	@$(PYTHON) -m venv $(VENV)/tools && $(VENV)/tools/bin/pip install $(PIP_FLAGS) uv==$(UV_VERSION) 2>&1 \
	  | { grep -v 'is neither a file nor a directory' || true; }; \
	  test -x $@ || echo "== no uv: the environments are made with venv + pip from the same locks"

# A stamp per environment, newer than its lock, pyproject.toml and tools/venv.sh: re-running
# setup is a no-op.
# (MXNet without Python 3.10/3.11 gets no stamp, only the line saying why: tools/venv.sh.)
.SECONDEXPANSION:
$(VENV)/%/.stamp: $$(call lock_of,$$*) pyproject.toml tools/venv.sh | $(filter $(VENV)/tools/bin/uv,$(UV))
	@VENV=$(VENV) UV=$(UV) PYTHON=$(PYTHON) PIP_FLAGS="$(PIP_FLAGS)" \
	  tools/venv.sh $* $< $(call pythons,$*)

setup: $(VENV)/base/.stamp $(foreach f,$(SELECTED),$(VENV)/$(f)/.stamp)

# Rewrite locks/*.txt from pyproject.toml. uv keeps the versions the existing lock pins (so the
# results stay valid) unless UPGRADE=1. One universal file per environment, for every Python of
# its list; then each is checked to install from wheels alone on x86_64 Linux for each of them.
override LOCKS := base torch jax jax-cuda mxnet
override extras_of = $(if $(filter base,$(1)),dev report docs,$(1) dev $(if $(filter mxnet,$(1)),report))
.PHONY: lock $(LOCKS:%=lock-%)
lock: $(LOCKS:%=lock-%)
$(LOCKS:%=lock-%): lock-%: | $(filter $(VENV)/tools/bin/uv,$(UV))
	$(if $(UV),,$(error make lock needs uv: leave UV unset (a pinned copy) or UV=uv))
	@echo "== locks/$*.txt for Python $(call pythons,$*)"
	@$(UV) pip compile -q pyproject.toml $(foreach e,$(call extras_of,$*),--extra $(e)) --universal \
	  --python-version $(firstword $(call pythons,$*)) $(if $(UPGRADE),--upgrade) \
	  --custom-compile-command "make lock" -o locks/$*.txt
	@for v in $(call pythons,$*); do \
	  $(UV) pip compile -q locks/$*.txt --python-version $$v --python-platform x86_64-manylinux_2_28 \
	    --only-binary :all: -o /dev/null || exit 1; \
	done

# A framework whose environment setup skipped (MXNet without Python 3.10/3.11) is skipped with
# setup's line, and the rest runs: `ready f || continue` in the loops below.
override READY = ready() { [ -e $(VENV)/$$1/.stamp ] && return; \
  echo "== $$1 skipped: $$(cat $(VENV)/$$1.skipped 2>/dev/null || echo 'not set up')"; return 1; }

# --- tests: framework-free suites in base (numpy 2) and again in mxnet (numpy 1.23); each
# framework's suite in its own environment
# Two tiers that together run every test once: `make test`, every test not marked `slow` (the
# suite a contributor runs after each change, minutes), and `make test-slow`, the slow ones and
# the framework-free suites again under MXNet's numpy 1.23. `make test-all` (CI) runs both.
# Each suite prints its seconds and its five slowest tests: a log says where the time went.
override TIER_test := not slow
override TIER_test-slow := slow
# Each suite runs through tools/suite.py: pytest-xdist's two tests at a time (most wait on one
# core: an import, a compilation, another process's start), an `xdist_group` on one worker (the
# cluster tests, torch's compile tests), JAX's files each on one (shared compiled programs); a
# crashed worker or a test past pytest-timeout's limit ends the suite, failing; the suite itself
# is stopped after SUITE_LIMIT seconds, with one line naming it. PYTEST_WORKERS=0: one at a time.
export PYTEST_WORKERS ?= 2
export SUITE_LIMIT ?= 1200
# How many of the slowest tests each suite lists (pytest --durations; 0: all).
export DURATIONS ?= 5
# JAX's persistent compilation cache, for the tests only: a program that one test process
# compiled (an xdist worker, a run a test starts, an earlier `make test`) is read back by the
# next instead of compiled again. The benchmarks keep compiling, as a user's first run does.
# The size limit makes JAX lock the cache's files (filelock): the workers share it.
override TEST_CACHE := $(CURDIR)/build/test-cache
test test-slow numerics: export JAX_COMPILATION_CACHE_DIR := $(TEST_CACHE)/jax
test test-slow numerics: export JAX_COMPILATION_CACHE_MAX_SIZE := 2000000000
test test-slow numerics: export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS := 0.1
# Not run again under numpy 1.23: what they test (processes and their signals, network
# namespaces, the pages in a browser) does not compute with numpy, and they wait the longest.
override NUMPY_FREE := tests/common/test_cluster.py tests/common/test_supervise.py \
  tests/common/test_lessons_browser.py
.PHONY: test-slow test-all
test test-slow: setup
	@status=0; start=$$(date +%s); $(READY); $(if $(filter AVX2,$(ISA)),export $(ISA_CAP);) \
	run() { $(VENV)/base/bin/python -m tools.suite --venv $(VENV) "$$@" || status=1; }; \
	run base "$(TIER_$@)" tests/common tests/compare; \
	for f in $(SELECTED); do \
	  ready $$f || continue; \
	  run $$f "$(TIER_$@)" tests/$${f}_impl; \
	done; \
	if [ $@ = test-slow ] && ready mxnet; then \
	  echo "== the framework-free suites under numpy 1.23"; \
	  run mxnet "" tests/common tests/compare $(NUMPY_FREE:%=--ignore=%); \
	fi; \
	echo "== make $@: $$(( $$(date +%s) - start )) s"; \
	exit $$status

test-all: test test-slow

# The GPU tier: every test marked `gpu` in the torch and JAX suites (MXNet's build is CPU-only),
# with how many ran and the total time, so a short lent GPU can run all of it first. On a GPU
# machine without .venvs: make test-gpu GPU_PYTHON=python3.
.PHONY: test-gpu
test-gpu:
	@status=0; start=$$(date +%s); \
	for f in torch jax; do \
	  py=$${GPU_PYTHON:-$(VENV)/$$f/bin/python}; echo "== pytest -m gpu in $$f ($$py)"; \
	  $$py -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests/$${f}_impl || status=1; \
	done; \
	echo "== make test-gpu: $$(( $$(date +%s) - start )) s"; \
	exit $$status

# --- numerics: the tests marked `numerics` (tests/fixtures/numerics.py), natively and with the CPU
# instruction set capped at AVX2, so an AVX-512 machine also runs what an AVX2 machine runs
# (oneDNN in torch, MKLDNN in MXNet, XLA:CPU in JAX each pick kernels by instruction set). They
# run as `make test` runs them (tools/suite.py: two workers, each with its share of the cores),
# so the capped run computes with the threads an AVX2 machine's `make test` does.
# `make test ISA=AVX2` (or test-slow) runs a whole tier capped.
# torch: ATen's kernels and TorchInductor's generated C++ (ATEN_CPU_CAPABILITY), oneDNN, MKL;
# TorchInductor's cache of its own, since it mixes up kernels built at another ISA
# (docs/design.md, Traps).
override ISA_CAP = ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 \
  MKL_ENABLE_INSTRUCTIONS=AVX2 XLA_FLAGS="$$XLA_FLAGS --xla_cpu_max_isa=AVX2" \
  TORCHINDUCTOR_CACHE_DIR=$(TEST_CACHE)/inductor-avx2
numerics: setup
	@status=0; $(READY); \
	for isa in $(NUMERICS_ISAS); do \
	  for f in $(SELECTED); do \
	    ready $$f || continue; \
	    echo "== numerics in $(VENV)/$$f, ISA $$isa"; \
	    ( if [ $$isa = AVX2 ]; then export $(ISA_CAP); fi; \
	      $(VENV)/base/bin/python -m tools.suite --venv $(VENV) $$f numerics tests/$${f}_impl ) \
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
	@$(READY); ready $(FRAMEWORK)
	@for w in $(BENCH_WORKLOADS); do \
	  $(VENV)/$(FRAMEWORK)/bin/python -m $(FRAMEWORK)_impl --workload $$w --gpus "$$GPUS" \
	    --platform "$$PLATFORM" --results "$$RESULTS" \
	    $${PRESET:+--preset "$$PRESET"} $${STRATEGY:+--strategy "$$STRATEGY"} $$ARGS || exit $$?; \
	done

# --- the ceiling: each workload's training step in a tight loop on one device, appending a
# record (strategy `ceiling`) that the report sets against the training runs (common/ceiling.py).
# One device always, so GPUS is not passed; resnet50 has no ceiling (refused in one line).
override CEILING_WORKLOADS := $(if $(filter all,$(WORKLOAD)),lenet resnet18,$(WORKLOAD))
ceiling:
	@$(MAKE) --no-print-directory setup $(if $(FRAMEWORK),FRAMEWORK=$(FRAMEWORK))
	@$(READY); for f in $(SELECTED); do \
	  ready $$f || continue; \
	  for w in $(CEILING_WORKLOADS); do \
	    $(VENV)/$$f/bin/python -m $${f}_impl.ceiling --workload $$w --platform "$$PLATFORM" \
	      --results "$$RESULTS" $${PRESET:+--preset "$$PRESET"} $$ARGS || exit $$?; \
	  done; \
	done

report: $(VENV)/base/.stamp
	$(VENV)/base/bin/python -m compare.report --results $$RESULTS --out "$$REPORTS" --html

# The README's reference tables, rewritten from the committed records in results/ (a test fails
# when they differ: tests/compare/test_readme.py).
.PHONY: readme-tables
readme-tables: $(VENV)/base/.stamp
	$(VENV)/base/bin/python -m compare.readme

# The documentation site (mkdocs.yml): the lessons, their code read from the source by name and
# their results from the records (tools/docs_hook.py), and the project's pages, into build/site,
# offline, with a picture of the ResNet-18 lesson's first screen beside its page; a broken page
# fails it in one line, and build/site changes only once the whole new site is there
# (tools/docs_build.py).
.PHONY: docs
docs: $(VENV)/base/.stamp
	$(VENV)/base/bin/python -m tools.docs_build

# A cluster in one box (cluster/train.py): a network namespace per node on a link of its own
# (LINKS: unlimited, 10gbit, 1gbit, 100mbit, ...), each node on its own cores running its
# framework's multi-node engine for resnet18; one record per run. Needs root (CAP_NET_ADMIN).
# Lesson 4's sharded strategies: CLUSTER_ARGS="--workload zero [--strategy zero2] ...".
NODES ?= 1 2
LINKS ?= unlimited 10gbit 1gbit 100mbit
CLUSTER_PRESET ?= cpu
CLUSTER_ARGS ?= --epochs 3 --steps-per-epoch 4
.PHONY: cluster
cluster: setup
	$(VENV)/base/bin/python -m cluster.train --frameworks $(SELECTED) --nodes $$NODES \
	  --links $$LINKS --preset "$$CLUSTER_PRESET" --results "$$RESULTS" $$CLUSTER_ARGS

# Each engine's all-reduce alone, as nccl-tests measures NCCL's (cluster/allreduce.py): RANKS
# nodes on loopback sharing the cores, then 2 nodes in network namespaces at each of LINKS (root).
RANKS ?= 2 4 8
COLLECTIVES_PRESET ?= cpu
# More options for cluster.allreduce, e.g. COLLECTIVES_ARGS="--peer-timeout 120".
COLLECTIVES_ARGS ?=
.PHONY: collectives
collectives: setup
	$(VENV)/base/bin/python -m cluster.allreduce --frameworks $(SELECTED) --ranks $$RANKS \
	  --links $$LINKS --preset "$$COLLECTIVES_PRESET" --results "$$RESULTS" $$COLLECTIVES_ARGS

# The main job: sets up what is missing, runs everything at the preset that fits the machine.
compare: setup
	$(VENV)/base/bin/python -m compare.run --frameworks $(SELECTED) --workloads $(BENCH_WORKLOADS) \
	  --results "$$RESULTS" --out "$$REPORTS" $${PRESET:+--preset "$$PRESET"} --platform "$$PLATFORM" --html

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
	  if [ -e $(VENV)/$$f/.stamp ]; then $(VENV)/$$f/bin/python -m $${f}_impl.info; \
	  else echo "$$f: environment not set up: $$(cat $(VENV)/$$f.skipped 2>/dev/null || echo make setup FRAMEWORK=$$f)"; fi; \
	done

clean:
	rm -rf "$$REPORTS" .pytest_cache .ruff_cache "$(TEST_CACHE)"

# What a user gives reaches the commands as environment, never as shell text: `make cluster
# LINKS='1gbit;echo x'` passes the word `1gbit;echo` on (refused there) and runs nothing.
# Lists (RESULTS, NODES, LINKS, RANKS, ARGS) are split into words where they are used. What make
# writes into a recipe itself (FRAMEWORK, WORKLOAD, VENV, PYTHON, ...) is checked at the top.
# (After every default above: an `export` of an undefined variable defines it, empty.)
export GPUS PLATFORM RESULTS REPORTS PRESET STRATEGY ARGS NODES LINKS CLUSTER_PRESET CLUSTER_ARGS \
  RANKS COLLECTIVES_PRESET COLLECTIVES_ARGS
