# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv with Python 3.11+ and installs tx from pyproject.toml first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test venv results clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[test]"
	touch $@

venv: $(BIN)/.installed

# The tests also install the interop extra (torch 2.13 CPU + transformers) for tests/interop.
$(BIN)/.installed-interop: $(BIN)/.installed
	$(BIN)/pip install -q -e ".[test,interop]"
	touch $@

demo: venv
	$(BIN)/tx train demo --workdir runs/demo

test: $(BIN)/.installed-interop
	$(BIN)/python -m pytest tests

# experiments/RESULTS.md: every ablation sweep, then its comparison (compare.md, .csv, PNGs).
RESULTS ?= runs/ablations
TX_RAW_DATA ?= $(abspath ../shared/data)
results: venv
	for s in ablate_positions ablate_norm_position ablate_ffn ablate_mlm_norm \
	    ablate_mt_label_smoothing; do \
	  TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx sweep $$s --workdir $(RESULTS)/$$s || exit 1; done
	$(BIN)/tx compare $(RESULTS)/ablate_positions --metric eval.extrapolation.256 --baseline position=alibi
	$(BIN)/tx compare $(RESULTS)/ablate_norm_position --metric eval.loss
	$(BIN)/tx compare $(RESULTS)/ablate_ffn --metric eval.loss
	$(BIN)/tx compare $(RESULTS)/ablate_mlm_norm --metric eval.loss
	$(BIN)/tx compare $(RESULTS)/ablate_mt_label_smoothing --metric eval.loss

clean:
	rm -rf $(VENV) runs
