# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean bench floors dataset browser

$(STAMP): pyproject.toml requirements-lock.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-lock.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .  # setuptools from the lock: no download
	touch $(STAMP)

install: $(STAMP)

dataset:
	@test -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz || test -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte || \
	  (command -v apt-get >/dev/null && (apt-get install -y -q dataset-fashion-mnist >/dev/null || (apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null))) || \
	  echo "warning: could not install dataset-fashion-mnist (needs root); tests that need it will be skipped"

demo: $(STAMP) dataset
	$(BIN)/vitlab demo

# Headless chromium for the tests that open the HTML reports (tests/browser.py); skipped where it cannot be installed.
browser:
	@test -x /usr/bin/chromedriver || \
	  (command -v apt-get >/dev/null && (apt-get install -y -q chromium chromium-driver >/dev/null || (apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null))) || \
	  echo "warning: could not install chromium + chromium-driver (needs root); the browser tests will be skipped"

# pytest-xdist: one worker per core of the 2-core CI machine (tests/conftest.py gives each its share of threads).
TEST_WORKERS ?= 2
test: $(STAMP) dataset browser
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# The tests that cover the dependencies, at their floors (requirements-floor.txt) in a venv of their own that
# borrows torch, torchvision and the rest from .venv through a .pth line after its own site-packages. Downloads.
FLOOR_TESTS := tests/test_model.py tests/test_posembed.py tests/test_hybrid.py tests/test_weights_ours.py \
  tests/test_weights_safety.py tests/test_weights_hf.py tests/test_weights_timm.py tests/test_weights_infer.py \
  tests/test_weights_hub.py tests/test_weights_download.py tests/test_weights_registry.py \
  tests/test_weights_publish.py tests/test_preprocess.py tests/test_data_arrays.py tests/test_data_webdataset.py \
  tests/test_data_randaugment.py tests/test_analysis_report.py tests/test_train.py
floors: $(STAMP)
	rm -rf .venv-floors && $(PY) -m venv .venv-floors
	grep -v '^timm==' requirements-floor.txt | .venv-floors/bin/pip install -q -r /dev/stdin
	.venv-floors/bin/pip install -q --no-deps $$(grep '^timm==' requirements-floor.txt)  # its torch: .venv's
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$(.venv-floors/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_dotvenv.pth"
	PYTHONPATH=src .venv-floors/bin/python -m pytest -q -p no:cacheprovider $(FLOOR_TESTS)

bench: $(STAMP)
	$(BIN)/vitlab bench

clean:
	rm -rf $(VENV) .venv-floors runs build *.egg-info
