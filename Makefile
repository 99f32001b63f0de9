# The whole set-up on a fresh machine: `make demo`, `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_PIN := torch==2.13.0

.PHONY: demo test lint typecheck unit venv clean bench gpu-check

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_PIN)" numpy
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev]"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/graphpipe demo

lint: $(STAMP)
	$(VENV)/bin/ruff check graphpipe tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest

test: lint typecheck unit

# On a CUDA machine with its own torch and no package index: CUDA tests, multi-rank pipelines on the GPU
# (ranks sharing one GPU; NCCL with two or more) against one device, bf16, a CUDA profile, throughput
# against torch pipelining (benchmarks/gpu/README.md). Not on $(STAMP): that would pip-install CPU torch.
gpu-check:
	bash benchmarks/gpu/run.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
