# One command each, on a fresh machine (Python 3.10+):  make train   |   make test
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The offline Multi30k mirror beside the checkout, when there is one; otherwise train.py downloads.
DATA_DIR ?= $(wildcard ../shared/data/multi30k)
CONFIG ?= configs/multi30k_de_en.yaml
RUN_DIR ?= runs/multi30k_de_en
TRAIN_FLAGS ?=  # e.g. --overwrite to train again into RUN_DIR, --resume to continue it

.PHONY: setup train test lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,hf,hub]"
	touch $@

setup: $(VENV)/.installed

train: setup
	$(PY) train.py --config $(CONFIG) --run-dir $(RUN_DIR) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(TRAIN_FLAGS)

test: setup
	$(PY) -m pytest -v

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache
