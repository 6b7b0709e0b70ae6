# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv with Python 3.11+ and installs tx from pyproject.toml first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test venv clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[test]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/tx train demo --workdir runs/demo

test: venv
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) runs
