# kstore developer and CI entry points. Everything runs from the project's own .venv.
#   make venv   create/refresh .venv (skipped while pyproject.toml is unchanged)
#   make test   full test suite (needs Java 17+ for PySpark; installs Chromium as root if missing)
#   make demo   run examples/demo.py
#   make lint   ruff check, ruff format --check, mypy --strict on the installed package layout
#   make bench  run the benchmarks
#   make clean  remove build and cache files (distclean also removes .venv)

SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.kstore-installed
PYTEST_ARGS ?=
# Three pytest-xdist workers on the 2-core machines: much of the suite waits (on servers,
# client processes, Spark's micro-batches) rather than computes. The Spark tests run in two
# groups, a JVM each (tests/conftest.py). The 25 slowest tests are listed at the end: the
# suite must stay under 20 minutes.
PYTEST_WORKERS ?= 3

# Spark workers must run the same interpreter (the venv has kstore installed).
SPARK_ENV := PYSPARK_PYTHON=$(abspath $(VPY)) PYSPARK_DRIVER_PYTHON=$(abspath $(VPY))

# The console's browser tests (tests/test_console_browser.py) drive Debian's Chromium through
# Playwright; they fail in CI without it. Installed here when missing, as root with apt (CI's
# machine and the developers' are such); elsewhere this says what to install.
CHROMIUM ?= /usr/bin/chromium

.PHONY: venv check-java browser test demo lint bench clean distclean

venv: $(STAMP)

# Re-installs only when pyproject.toml is newer than the stamp (or the venv is missing).
$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip 'setuptools>=69' wheel
	$(VPY) -m pip install -q -e '.[test]'
	@touch $@

check-java:
	@bash scripts/check_java.sh

browser:
	@if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make: installing Debian's chromium for the browser tests"; \
		log=$$(mktemp); \
		if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >"$$log" 2>&1; then \
			tail -20 "$$log"; rm -f "$$log"; echo "make: apt-get could not install chromium" >&2; exit 1; \
		fi; rm -f "$$log"; \
	else \
		echo "make: no $(CHROMIUM): install Debian's chromium (apt-get install chromium) for the browser tests" >&2; \
	fi

test: venv check-java browser
	@set +e; $(SPARK_ENV) $(VPY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=25 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5); treating as failure" >&2; fi; \
	exit $$rc

demo: venv check-java
	$(SPARK_ENV) $(VPY) examples/demo.py

# mypy cannot follow setuptools' package-dir mapping (cli/ -> kstore.cli, ...) in the source
# tree, so it checks a throwaway non-editable install of the package in .typecheck/.
# All three checks run; the target fails at the end if any of them failed.
lint: venv
	@status=0; \
	echo "== ruff check"; $(VENV)/bin/ruff check . || status=1; \
	echo "== ruff format --check"; $(VENV)/bin/ruff format --check . || status=1; \
	echo "== mypy (strict) on an installed copy in .typecheck/"; rm -rf .typecheck; \
	$(VPY) -m pip install --no-deps --no-build-isolation -q --target .typecheck . \
		&& $(VENV)/bin/mypy .typecheck/kstore || status=1; \
	exit $$status

bench: venv check-java
	$(SPARK_ENV) $(VPY) benchmarks/run_all.py

clean:
	rm -rf .typecheck build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
