# Everything a developer and CI run. `make run` and `make test` install what is missing first.
PY ?= /usr/bin/python3
VENV := .venv
RUNTIME := .runtime
HOST ?= 127.0.0.1
PORT ?= 8080
DATA_DIR ?= ./sandbank-data

.PHONY: install install-dev system-deps test-system-deps run test test-fast tiers coverage-html lint typecheck bench clean

system-deps:
	@scripts/install-system-deps

test-system-deps:
	@SANDBANK_TEST_DEPS=1 scripts/install-system-deps

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed pyproject.toml
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# The E2B JS SDK the tests drive (tests/e2b), from npm; node and npm come from the dev extra.
# Node trusts only its own CA bundle: the system's is added, so a machine whose traffic goes
# through a TLS-inspecting proxy (its CA trusted system-wide) reaches the registry too.
E2B_JS := tests/e2b/js
SYSTEM_CAS := /etc/ssl/certs/ca-certificates.crt
$(E2B_JS)/node_modules/.installed: $(VENV)/.dev-installed $(E2B_JS)/package.json $(E2B_JS)/package-lock.json
	cd $(E2B_JS) && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
		NODE_EXTRA_CA_CERTS="$${NODE_EXTRA_CA_CERTS:-$$(test -f $(SYSTEM_CAS) && echo $(SYSTEM_CAS))}" \
		npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The sandbox runtime: its own venv from Debian's Python, readable by the sandbox users, sealed
# (no host path inside; pip refuses installs at run time; the list of its packages written into
# it) and packed as an image (.runtime.img). runtime/requirements.txt pins every package
# (scripts/lock-runtime resolves runtime/requirements.in).
$(RUNTIME)/.packages: runtime/requirements.txt
	$(PY) -m venv $(RUNTIME)
	rm -f $(RUNTIME)/pip.conf
	$(RUNTIME)/bin/python3 -m pip install -q --upgrade pip
	$(RUNTIME)/bin/python3 -m pip install -q -r runtime/requirements.txt $(SANDBANK_EXTRA_PACKAGES)
	touch $@

# sb-init, the forked sandboxes' PID 1: static, so it runs from the image whatever is inside.
$(RUNTIME)/.installed: $(RUNTIME)/.packages runtime/sb-init.c scripts/seal-runtime runtime/requirements.in
	mkdir -p $(RUNTIME)/libexec
	cc -static -Os -Wall -Wextra -Werror -o $(RUNTIME)/libexec/sb-init runtime/sb-init.c
	$(PY) scripts/seal-runtime $(RUNTIME) --requested runtime/requirements.in \
		--extra "$(SANDBANK_EXTRA_PACKAGES)"
	touch $@

install: system-deps $(VENV)/.installed $(RUNTIME)/.installed

install-dev: test-system-deps install $(VENV)/.dev-installed $(E2B_JS)/node_modules/.installed

run: install
	$(VENV)/bin/sandbank serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)

lint: install-dev
	$(VENV)/bin/ruff format --check src tests bench scripts
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/lint-imports

typecheck: install-dev
	$(VENV)/bin/mypy

# The whole suite with branch coverage of src/ (servers the tests start included), printed and
# gated (pyproject's [tool.coverage.report] fail_under); `make coverage-html` then draws it.
test: install-dev lint typecheck
	$(VENV)/bin/pytest -q --durations=25 --cov --cov-report=term

# The fast tier: no root, no sandbox, no server (tests/tiers.py says which tests are which).
test-fast: install-dev
	$(VENV)/bin/pytest -q -n 2 -m "not root and not postgres and not s3 and not chromium"

tiers: install-dev
	$(VENV)/bin/python scripts/test_tiers.py

coverage-html: install-dev
	$(VENV)/bin/coverage html && echo "open htmlcov/index.html"

bench: install
	$(VENV)/bin/python bench/runtime.py

clean:
	rm -rf $(VENV) $(RUNTIME) $(RUNTIME).img $(E2B_JS)/node_modules
