# Two commands: `make demo` and `make test`. Each builds what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JS     := js/node_modules/.installed
# Crossbar.io for the bridge tests and benches, in its own virtualenv: it pins old dependencies
# that must not meet ours. The tests find it through $$PUBSUBCLUB_CROSSBAR (default: this path).
CROSSBAR_VENV    := .crossbar-venv
CROSSBAR_VERSION := 26.10.1
CROSSBAR_STAMP   := $(CROSSBAR_VENV)/.installed-$(CROSSBAR_VERSION)

.PHONY: demo test test-deps lint unit js crossbar browser sysdeps bench bench-peers router-suite clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

$(JS): js/package.json js/package-lock.json
	cd js && npm ci --ignore-scripts --no-audit --no-fund
	touch $@

js: $(JS)

$(CROSSBAR_STAMP):
	test -x $(CROSSBAR_VENV)/bin/python || $(PYTHON) -m venv $(CROSSBAR_VENV)
	$(CROSSBAR_VENV)/bin/python -m pip install -q --upgrade pip
	$(CROSSBAR_VENV)/bin/python -m pip install -q 'crossbar==$(CROSSBAR_VERSION)'
	$(CROSSBAR_VENV)/bin/crossbar version >/dev/null
	touch $@

crossbar: $(CROSSBAR_STAMP)

# Debian's Chromium for the browser test (needs root, as on CI).
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# System packages the tests use: Chromium, docker-compose (validates deploy/; no engine needed),
# systemd-analyze (verifies the unit in deploy/systemd), and ip + nft (iproute2, nftables) for the
# network-namespace partition tests (tests/helpers/netns.py; they run as root). Each entry is
# command:package; the missing ones are installed after a single apt-get update (each update
# costs seconds to a minute on a fresh machine). Chromium keeps its recommended packages (fonts).
SYSDEPS_RECOMMENDS    := chromium:chromium
SYSDEPS_NO_RECOMMENDS := ip:iproute2 nft:nftables docker-compose:docker-compose systemd-analyze:systemd
missing = $$(for want in $(1); do command -v $${want%%:*} >/dev/null 2>&1 || printf '%s ' $${want\#*:}; done)
sysdeps:
	@with="$(call missing,$(SYSDEPS_RECOMMENDS))"; without="$(call missing,$(SYSDEPS_NO_RECOMMENDS))"; \
	if [ -n "$$with$$without" ]; then \
	  echo "installing system packages: $$with$$without"; \
	  apt-get update -qq && export DEBIAN_FRONTEND=noninteractive && \
	  { [ -z "$$with" ] || apt-get install -y -qq $$with; } && \
	  { [ -z "$$without" ] || apt-get install -y -qq --no-install-recommends $$without; }; \
	fi

demo: $(STAMP) $(JS) examples/sysv/client
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check pubsubclub tests examples
	$(VENV)/bin/mypy

# The System V example client (docs/sysv.md); the SysV tests also build their own copy.
examples/sysv/client: examples/sysv/client.c examples/sysv/pubsubclub_sysv.h
	gcc -std=c11 -Wall -Wextra -O2 -o $@ examples/sysv/client.c

# What the tests need, built side by side (downloads overlap with lint), then the tests.
# Two pytest-xdist workers, each test module whole on one (docs/architecture.md, "Suite time"); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test:
	$(MAKE) -j4 --output-sync=target test-deps
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile

test-deps: $(STAMP) $(JS) $(CROSSBAR_STAMP) sysdeps lint examples/sysv/client

bench: $(STAMP)
	$(VENV)/bin/pubsubclub bench

# The WAMP runs against pubsubclub and Crossbar.io (one server, then two linked), one table of
# ratios (docs/benchmarks.md), then cross-node calls, idle sessions and fan-out (--rows).
# BENCH_PEERS_ARGS adds settings, e.g. BENCH_PEERS_ARGS='--runs 1 --rows calls'. The time bound of
# each run is 120 s: 10,000 idle sessions take a minute to open on a loaded 2-core machine.
BENCH_PEERS_ARGS ?= --runs 3 --max-seconds 120
bench-peers: $(STAMP) $(CROSSBAR_STAMP)
	$(VENV)/bin/pubsubclub bench --scenario peers $(BENCH_PEERS_ARGS)

# Autobahn|JS's router integration suite against one node, two nodes with connections
# alternating between them, and Crossbar.io as the control (docs/conformance.md). No registry
# ships its v26 form (`make test` runs the older form from npm's autobahn 19.4.1):
# PUBSUBCLUB_AUTOBAHN_JS names a copy of crossbario/autobahn-js (or ../shared/autobahn-js is
# used); here its absence fails instead of skipping.
router-suite: $(STAMP) $(JS) $(CROSSBAR_STAMP)
	PUBSUBCLUB_AUTOBAHN_JS_REQUIRED=1 $(VENV)/bin/pytest -v -s -p no:cacheprovider tests/test_autobahn_js_suite.py

clean:
	rm -rf $(VENV) $(CROSSBAR_VENV) js/node_modules .pytest_cache .mypy_cache .ruff_cache .hypothesis
