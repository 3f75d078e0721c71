# Two entry points, each bootstrapping .venv idempotently on a machine with only Python and pip.
#   make demo           the main job: the paper's pendulum regression (data generated if absent)
#   make demo QUICK=1   a first look: a tenth of the epochs
#   make test           lint + the test suite, in parallel worker processes (pytest-xdist:
#                       up to 4; `make test PYTEST_WORKERS=0` runs it in this process)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= auto

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/s5jax train pendulum --workdir runs/pendulum$(if $(QUICK),-quick --quick,)

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --maxprocesses 4

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
