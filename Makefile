# One command each, on a fresh machine (Python 3.10+):  make train   |   make test      (make help: the rest)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Where Multi30k is (data/README.md): DATA_DIR=DIR, else $MULTI30K_DIR, else the user's data folder
# ($XDG_DATA_HOME/transformer-mt/multi30k, by default ~/.local/share/transformer-mt/multi30k; downloaded).
DATA_DIR ?=
CONFIG ?= multi30k_de_en  # a config the package ships (transformer/configs/), or a YAML path
RUN_DIR ?= runs/multi30k_de_en
TRAIN_FLAGS ?=  # e.g. --overwrite to train again into RUN_DIR, --resume to continue it
PYTEST_FLAGS ?=  # e.g. -x, -k attention, tests/core/test_model.py
PYTEST_WORKERS ?= 2  # test processes side by side (pytest-xdist), each on one thread; 0: pytest alone

.PHONY: help setup data train test lint clean

help:
	@echo "make train   set up .venv, fetch Multi30k, train CONFIG into RUN_DIR and print test BLEU"
	@echo "make test    set up .venv, fetch Multi30k, run the whole test suite (pytest)"
	@echo "make data    fetch Multi30k into ~/.local/share/transformer-mt/multi30k, check its SHA-256 sums (or check DATA_DIR)"
	@echo "make setup   create .venv with torch 2.13.0 and the package (extras dev, hf, hub, int8, serve)"
	@echo "make lint    ruff check and ruff format --check"
	@echo "make clean   remove .venv, runs/ and the token cache (\$$TRANSFORMER_MT_CACHE, else ~/.cache/transformer-mt)"
	@echo
	@echo "variables: CONFIG=$(CONFIG)  RUN_DIR=$(RUN_DIR)  TRAIN_FLAGS=--overwrite|--resume"
	@echo "           DATA_DIR=folder with the Multi30k files (else \$$MULTI30K_DIR, else your data folder;"
	@echo "           MULTI30K_URL=another download mirror)  PYTEST_FLAGS=...  PYTEST_WORKERS=$(PYTEST_WORKERS)"
	@echo "           PYTHON=$(PYTHON)  VENV=$(VENV)"

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
	  echo "error: $(PYTHON) is missing or older than 3.10; install Python 3.10+ or run make PYTHON=python3.11"; \
	  exit 1; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "error: $(PYTHON) cannot create a virtual environment (no venv/ensurepip module)."; \
	  echo "       On Debian/Ubuntu: sudo apt install python3-venv   (or python3.X-venv for your version)"; \
	  exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,hf,hub,int8,serve]"
	touch $@

setup: $(VENV)/.installed

data: setup
	$(PY) -m transformer.training.multi30k $(if $(DATA_DIR),--data-dir $(DATA_DIR))

train: data
	$(PY) train.py --config $(CONFIG) --run-dir $(RUN_DIR) $(if $(DATA_DIR),--data-dir $(DATA_DIR)) $(TRAIN_FLAGS)

test: data
	$(if $(DATA_DIR),MULTI30K_DIR=$(DATA_DIR)) $(PY) -m pytest -v -rs -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_FLAGS)

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The token cache: data.cache_dir of a config, else $TRANSFORMER_MT_CACHE, else $XDG_CACHE_HOME/transformer-mt.
CACHE_DIR := $(or $(TRANSFORMER_MT_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/transformer-mt)

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache "$(CACHE_DIR)"
