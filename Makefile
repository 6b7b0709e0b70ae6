# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv with Python 3.11+ and installs tx from pyproject.toml first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test venv results recipe-mt clean

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

# One worker per core, at most 4 (each holds a jax process and starts more); a file's tests
# stay on one worker, so a module's fixtures run once. TEST_WORKERS=0 runs them in one process.
# The 20 slowest tests are listed at the end: CI must stay within 30 minutes on every host.
TEST_WORKERS ?= auto --maxprocesses 4
test: $(BIN)/.installed-interop
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=20

# experiments/RESULTS.md: every ablation and LR-sensitivity sweep, then its comparison
# (compare.md/.csv, lr_curves.md/.csv, PNGs). On the 2-core project machine: the ablations
# about 45 min, the three lm_lr_probe LR studies about 80 min, the MLM LR sweep about 11 min,
# the sliding-window study about 20 min, the Multi30k LR sweep 65 min and lr_mup_width about
# 2.5 h (these two measured while sharing the cores with each other and with tests; less
# alone): about 5.5 h in all. Resumable: rerun to continue.
RESULTS ?= runs/ablations
LR_RESULTS ?= runs/lr
TX_RAW_DATA ?= $(abspath ../shared/data)
ABLATIONS = ablate_positions ablate_norm_position ablate_ffn ablate_mlm_norm ablate_mt_label_smoothing
LR_STUDIES = norm_position qk_norm z_loss mlm_norm_position mt_label_smoothing mup_width
results: venv
	for s in $(ABLATIONS); do \
	  TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx sweep $$s --workdir $(RESULTS)/$$s || exit 1; done
	$(BIN)/tx compare $(RESULTS)/ablate_positions --metric eval.extrapolation.256 --baseline position=alibi
	$(BIN)/tx compare $(RESULTS)/ablate_norm_position --metric eval.loss
	$(BIN)/tx compare $(RESULTS)/ablate_ffn --metric eval.loss
	$(BIN)/tx compare $(RESULTS)/ablate_mlm_norm --metric eval.loss
	$(BIN)/tx compare $(RESULTS)/ablate_mt_label_smoothing --metric eval.loss
	for s in $(LR_STUDIES); do \
	  TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx sweep lr_$$s --workdir $(LR_RESULTS)/$$s || exit 1; \
	  $(BIN)/tx compare $(LR_RESULTS)/$$s --x optim.learning_rate \
	    --curves loss diag/attn_logit_max diag/log_z_mean || exit 1; done
	$(BIN)/tx mup-check lm_lr_probe --widths 64,128,256,512 --steps 10 \
	  --set model.mup_base_width=64 optim.learning_rate=1e-2 --out $(LR_RESULTS)/mup_check
	TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx sweep window_local_global --workdir runs/arch/window
	for m in eval.loss eval.extrapolation.256 eval.extrapolation.512; do \
	  $(BIN)/tx compare runs/arch/window --metric $$m --out runs/arch/window/compare_$$m || exit 1; done

# The Multi30k reference recipe end to end (tx/experiments/mt_multi30k_en_de.py): the two
# LR sweeps that chose its rate and warmup (~25 min), the training run (~55 min; it averages
# its last 5 checkpoints into runs/mt/recipe/average), the choices of averaging, beam size
# and length penalty on validation (~8 min), and one score on test_2016_flickr (~1 min).
recipe-mt: venv
	TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx sweep mt_recipe_lr --workdir runs/mt/recipe_lr
	TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx sweep mt_recipe_warmup --workdir runs/mt/recipe_warmup
	$(BIN)/tx compare runs/mt/recipe_lr runs/mt/recipe_warmup --out runs/mt/recipe_lr_compare
	TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx train mt_multi30k_en_de --workdir runs/mt/recipe
	$(BIN)/tx average --workdir runs/mt/recipe --last 10 --out runs/mt/recipe_avg10
	for d in recipe recipe/average; do TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx decode-search \
	  --workdir runs/mt/$$d --beam-size 1 4 5 --length-penalty 0.6 1.0 1.4 || exit 1; done
	TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx decode-search --workdir runs/mt/recipe_avg10 \
	  --beam-size 4 5 --length-penalty 1.0 1.4
	TX_RAW_DATA=$(TX_RAW_DATA) $(BIN)/tx eval --workdir runs/mt/recipe/average --split test

clean:
	rm -rf $(VENV) runs
