# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean bench

$(STAMP): pyproject.toml requirements-lock.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-lock.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

dataset:
	@test -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz || test -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte || \
	  (command -v apt-get >/dev/null && (apt-get install -y -q dataset-fashion-mnist >/dev/null || (apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null))) || \
	  echo "warning: could not install dataset-fashion-mnist (needs root); tests that need it will be skipped"

demo: $(STAMP) dataset
	$(BIN)/vitlab demo

test: $(STAMP) dataset
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/vitlab bench

clean:
	rm -rf $(VENV) runs build *.egg-info
