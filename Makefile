# The two commands of the README. Both create the virtual env on first use.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: demo test install install-test bench clean

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

clean:
	rm -rf $(VENV) runs .pytest_cache
