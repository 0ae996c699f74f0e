# The two commands of the README. Both create the virtual env on first use.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test install install-test bench trl-venv bench-trl clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/reinforge demo

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

clean:
	rm -rf $(VENV) runs .pytest_cache
