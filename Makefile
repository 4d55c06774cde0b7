# undolog: `make run` serves the dashboard and API with embedded defaults; `make test` tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt sdk/pyproject.toml | cksum | cut -d" " -f1)
PORT ?= 8000

.PHONY: run test lint check extras bench demo browser clean

$(STAMP): requirements.txt sdk/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	rm -f $(VENV)/.installed-*
	touch $@

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py setupdemo
	PORT=$(PORT) $(PY) -m undolog_site.launcher

# Debian's Chromium for the browser tests; installed once, only where it is missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) browser
	$(PY) -m pytest $(PYTEST_ARGS)
	cd sdk && ../$(PY) -m pytest -p no:django -p no:cacheprovider tests

lint: $(STAMP)
	$(PY) -m ruff check .

check: $(STAMP) extras
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) -m ruff check .

# Each SDK framework extra in a fresh venv (about 45 s: too slow for every `make test`).
extras: $(STAMP)
	$(PY) sdk/scripts/check_extras.py

bench: $(STAMP)
	$(PY) -m bench

demo: $(STAMP)
	$(PY) -m sdk.demo $(DEMO_ARGS)

clean:
	rm -rf var/test-* .pytest_cache
