# Two entry points, each bootstrapping .venv idempotently on a machine with only Python and pip.
#   make demo           the main job: the paper's pendulum regression (data generated if absent);
#                       run again, it resumes a killed run or prints a complete run's results
#   make demo QUICK=1   a first look: a tenth of the epochs
#   make test           lint + the test suite, in parallel worker processes (pytest-xdist:
#                       up to 4; `make test PYTEST_WORKERS=0` runs it in this process); it
#                       ends with the 20 slowest tests, to keep the suite inside CI's budget
#   make docs           the documentation site (mkdocs.yml, docs/) into site/, warnings fatal
#   make docs-serve     the same site, served locally with live reload
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.docs-installed-stamp
PYTEST_WORKERS ?= auto

.PHONY: demo test lint docs docs-serve clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# The docs extra (mkdocs, mkdocs-material, mkdocstrings) has its own stamp: `make test` never
# installs it, and it is installed again only when pyproject.toml (or the base install) changes.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev,docs]"
	touch $(DOCS_STAMP)

demo: $(STAMP)
	$(BIN)/s5jax train pendulum --workdir runs/pendulum$(if $(QUICK),-quick --quick,) --resume-or-start

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --maxprocesses 4 --durations=20

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
