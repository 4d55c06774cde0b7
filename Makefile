# undolog: `make run` serves the dashboard and API with embedded defaults; `make test` tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt sdk/pyproject.toml | cksum | cut -d" " -f1)
PORT ?= 8000

.PHONY: run worker test lint check schema extras bench demo browser clean test-js check-js gateway-npm bench-js demo-js image container-test kube-check nemesis nemesis-short nemesis-mutants nemesis-tools

$(STAMP): requirements.txt sdk/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	rm -f $(VENV)/.installed-*
	touch $@

# Quiet unless something fails: the summary box (printed once the worker answers) comes last.
run: $(STAMP)
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py setupdemo
	PORT=$(PORT) $(PY) -m undolog_site.launcher

# One more Celery worker for a running `make run` (same checkout, same DATABASE_URL): `WORKERS=2
# make run` starts two at once.
worker: $(STAMP)
	$(PY) -m undolog_site.launcher worker

# Debian's Chromium for the browser tests; installed once, only where it is missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) browser
	$(PY) -m pytest $(PYTEST_ARGS)
	cd sdk && ../$(PY) -m pytest -p no:django -p no:cacheprovider tests
	$(MAKE) test-js

lint: $(STAMP)
	$(PY) -m ruff check .

check: $(STAMP) extras
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-logo --no-cache  # .importlinter: imports point down, no circle in a package
	$(PY) tools/module_edges.py  # no private name borrowed from another module
	@mkdir -p var
	$(PY) manage.py spectacular --validate --fail-on-warn --file var/openapi.check.yaml
	@diff -u docs/openapi.yaml var/openapi.check.yaml > var/openapi.diff || { \
	  echo "docs/openapi.yaml does not match the code: run 'make schema' and commit it."; head -60 var/openapi.diff; exit 1; }
	$(MAKE) check-js

# The OpenAPI schema, generated from the code into the repo: the API's contract for clients.
schema: $(STAMP)
	$(PY) manage.py spectacular --validate --fail-on-warn --file docs/openapi.yaml

# Each SDK framework extra in a fresh venv (about 45 s: too slow for every `make test`).
extras: $(STAMP)
	$(PY) sdk/scripts/check_extras.py

bench: $(STAMP) .venv-agentdojo/.installed
	$(PY) -m bench

# The long nemesis run (tests/faults/nemesis.py): hosts in network namespaces, faults of every kind,
# the checker over the history. Root, iproute2, nftables and faketime (Debian packages).
NEMESIS_S ?= 600
NEMESIS_FAULTS ?= 50
nemesis: $(STAMP) nemesis-tools
	$(PY) -m tests.faults.nemesis --seconds $(NEMESIS_S) --faults $(NEMESIS_FAULTS) $(NEMESIS_ARGS)

# CI's short run: one fault of each kind on each role it can strike (13, a few minutes), the same
# checker. The seed varies and is printed; NEMESIS_SEED=... replays one.
nemesis-short: $(STAMP) nemesis-tools
	$(PY) -m tests.faults.nemesis --seconds 0 --faults 13 $(NEMESIS_ARGS)

# The checker proven by deliberate bugs (tests/faults/mutants/): each planted in a scratch copy, the
# short nemesis run on it; prints the table (bug, caught, the checker's message). Outside CI: ~45 min.
nemesis-mutants: $(STAMP) nemesis-tools
	$(PY) -m tests.faults.mutate $(NEMESIS_MUTANTS)

nemesis-tools:
	@command -v ip >/dev/null && command -v nft >/dev/null && test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || { \
	  echo "installing Debian's iproute2, nftables and faketime for the nemesis run"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq iproute2 nftables faketime >/dev/null; }

# AgentDojo's own venv (bench/agentdojo.py replays its suites through the server from it).
.venv-agentdojo/.installed: bench/agentdojo-requirements.txt
	test -x .venv-agentdojo/bin/python || $(PYTHON) -m venv .venv-agentdojo
	.venv-agentdojo/bin/python -m pip install -q -r bench/agentdojo-requirements.txt
	touch $@

# Finds `make run`'s server on the same PORT (PORT=8765 make run, then PORT=8765 make demo).
demo: $(STAMP)
	PORT=$(PORT) $(PY) -m sdk.demo $(DEMO_ARGS)

# The TypeScript SDK (sdk-js/): its locked dependencies, installed by `npm ci` when the lock changes.
JS_STAMP := sdk-js/node_modules/.installed-$(shell cat sdk-js/package-lock.json | cksum | cut -d" " -f1)

$(JS_STAMP): sdk-js/package.json sdk-js/package-lock.json
	cd sdk-js && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The real MCP servers the gateway's pre-image presets are tested against (tests/gateway/npm:
# @modelcontextprotocol/server-filesystem and server-memory, locked); the tests install them too.
gateway-npm:
	cd tests/gateway/npm && npm ci --no-audit --no-fund --loglevel=error

# Its tests against a real server of their own (test/server.py: a fresh database, DATABASE_URL and REDIS_URL honoured).
test-js: $(STAMP) $(JS_STAMP)
	$(PY) sdk-js/test/server.py -- npm --prefix sdk-js test --silent

check-js: $(JS_STAMP)
	cd sdk-js && npx tsc --noEmit -p tsconfig.json
	$(PYTHON) tools/module_edges.py --ts sdk-js/src  # no circle between the SDK's files

bench-js: $(STAMP) $(JS_STAMP)
	$(PY) sdk-js/test/server.py -- npm --prefix sdk-js run bench --silent

# The account cleanup with an AI SDK agent (its mock model) against `make run` on the same PORT.
demo-js: $(STAMP) $(JS_STAMP)
	PORT=$(PORT) $(PY) sdk-js/demo/run.py

# The one container image (deploy/Containerfile) with podman; makes its Debian base with debootstrap
# where no registry answers, and installs podman first where it is missing (deploy/image.sh).
image:
	deploy/image.sh

# Builds the image, brings deploy/compose.yaml up on ports of its own, plays the story through the
# proxy, kills a worker mid-walk, and brings everything down (deploy/container_test.py).
container-test: $(STAMP) image
	$(PY) deploy/container_test.py

# The Kubernetes manifests against the API's schemas (kubernetes-validate, strict); no cluster used.
kube-check:
	deploy/kubernetes/check.sh

clean:
	rm -rf var/test-* .pytest_cache
