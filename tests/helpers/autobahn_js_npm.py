"""Autobahn|JS's older router suite, as npm's ``autobahn`` 19.4.1 ships it, run against nodes.

Unlike the v26 vitest suite (tests/helpers/autobahn_js.py, which needs a git copy of
crossbario/autobahn-js), the 19.4.1 tarball holds its ``test/``: nodeunit-style files,
each exporting test functions, with golden logs (``test/*.txt``) that the suite's
``Testlog`` compares each run's log against. It comes with ``npm ci`` (``autobahn-19``
in js/package.json), so CI runs it.

Each file runs in its own ``node`` process under tests/js/nodeunit_runner.js (our
runner; nodeunit itself is not used), from a copy of ``test/`` in a temporary
directory beside symlinks to the package's ``index.js`` and ``lib/`` (Testlog opens its
baseline relative to the working directory and writes one when it is missing). The
vitest suite's setup file points ``testutil.config.url`` at the node under test and
sends RawSocket dials of 127.0.0.1:8080 to the node's RawSocket port.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from helpers.autobahn_js import JS, REPO, FileResult, suite_env
from helpers.autobahn_js import ROUTER_FILES as V26_ROUTER_FILES

#: npm's autobahn 19.4.1 (an alias in js/package.json): its lib/ and its test/.
AUTOBAHN_19 = JS / "node_modules" / "autobahn-19"
VERSION = "19.4.1"
RUNNER = REPO / "tests" / "js" / "nodeunit_runner.js"

#: The files that need a router: every ``test/test_*.js`` of 19.4.1 but the three unit files
#: (the same 23 names as the v26 suite's router files; prepare() checks the package's list).
#: ``test_cryptosign.html`` is a browser page, no test.
ROUTER_FILES = V26_ROUTER_FILES
UNIT_FILES = ("test_basic_async", "test_basic_sync", "test_rawsocket_protocol")

#: Files whose baseline fixes an order between messages to different sessions, which WAMP
#: leaves open (no order is promised between the EVENTs of different subscribers, nor
#: between them and the publisher's PUBLISHED). Upstream dropped both baselines as
#: non-deterministic (autobahn-js 1af48360, before v26). These files pass when their log
#: differs from the baseline only so: the same deliveries, order aside (see same_deliveries).
UNORDERED_BASELINES = ("test_pubsub_multiple_matching_subs", "test_pubsub_options")
#: The start of test_pubsub_options's log line for a PUBLISHED (the publisher's acknowledgement).
ACK_LINE = '"event published"'

#: Per test, until done() (the slowest, test_rpc_slowsquare, takes about 3 s).
TEST_TIMEOUT_S = 15
#: Bound on one file's process: its tests (test_error_handling has four) and node's start.
FILE_TIMEOUT_S = 4 * TEST_TIMEOUT_S + 30

#: The line prefix of the runner's per-test results.
MARKER = "PUBSUBCLUB-RESULT "


def prepare(work: Path) -> Path:
    """Lay out ``work/autobahn`` (a copy of 19.4.1's test/ beside its index.js and lib/); returns it.

    Fails, never skips, when the package is not installed: it comes with ``npm ci``.
    """
    manifest = AUTOBAHN_19 / "package.json"
    if not manifest.exists():
        raise AssertionError(f"{AUTOBAHN_19} missing: run `make js` (cd js && npm ci)")
    version = json.loads(manifest.read_text())["version"]
    assert version == VERSION, f"{AUTOBAHN_19} is autobahn {version}, not {VERSION}"
    found = sorted(p.stem for p in (AUTOBAHN_19 / "test").glob("test_*.js"))
    assert found == sorted(ROUTER_FILES + UNIT_FILES), f"autobahn {VERSION}'s test files changed: {found}"
    root = work / "autobahn"
    shutil.copytree(AUTOBAHN_19 / "test", root / "test")
    # Symlinks: node resolves them to js/node_modules/autobahn-19, so lib/ finds its own dependencies.
    (root / "index.js").symlink_to(AUTOBAHN_19 / "index.js")
    (root / "lib").symlink_to(AUTOBAHN_19 / "lib")
    return root


def run_file(root: Path, name: str, url: str, rawsocket_port: int, log: Path) -> FileResult:
    """Run one suite file against ``url`` and ``rawsocket_port``; its outcome (output appended to ``log``)."""
    env = suite_env(root, url, rawsocket_port)
    baselines = set((root / "test").glob("*.txt"))
    cmd = ["node", str(RUNNER), f"test/{name}.js", str(TEST_TIMEOUT_S * 1000)]
    try:
        proc = subprocess.run(
            cmd, cwd=root, env=env, capture_output=True, text=True, check=False, timeout=FILE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return FileResult(False, f"the runner did not finish within {FILE_TIMEOUT_S} s")
    output = proc.stdout + proc.stderr
    with log.open("a") as out:
        out.write(f"===== {name}\n{output}\n")
    records = [json.loads(line[len(MARKER) :]) for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    # A failed Testlog comparison is an ok(false) whose message holds both logs ("Expected: ... Got: ...").
    failures = [
        f"{record['name']}: {failure}"
        for record in records
        for failure in record["failures"]
        if not (name in UNORDERED_BASELINES and only_reordered(failure))
    ]
    if not records:
        failures.append(f"no test reported (exit {proc.returncode}): {output[-1500:]}")
    # Testlog writes a baseline it lacks and then passes: every router file has one in 19.4.1.
    written = sorted(path.name for path in set((root / "test").glob("*.txt")) - baselines)
    if written:
        failures.append(f"Testlog wrote baselines that the package lacks: {written}")
    if not failures and any(record["failures"] for record in records):
        return FileResult(True, "passes: its log differs from the baseline only in the order across sessions")
    return FileResult(not failures, "\n".join(failures))


def log_records(log: str) -> list[str]:
    """A Testlog text's records: its lines without their numbers, a ``"subscription:`` line joined to the one before."""
    records: list[str] = []
    for line in log.strip().splitlines():
        text = line.split(" ", 1)[1] if " " in line else ""
        if text.startswith('"subscription:') and records:
            records[-1] += " " + text
        else:
            records.append(text)
    return records


def same_deliveries(expected: str, got: str) -> bool:
    """Whether two Testlog texts hold the same records order aside, the acknowledgements of the publisher apart.

    The log ends when the subscriber has its last event, so the PUBLISHED of that last
    publication may come after it: ``got`` may hold one acknowledgement fewer.
    """
    want, have = log_records(expected), log_records(got)
    if want[:1] != have[:1] or want[-1:] != have[-1:]:
        return False
    acks_wanted = sum(r.startswith(ACK_LINE) for r in want)
    acks_had = sum(r.startswith(ACK_LINE) for r in have)
    deliveries_wanted = sorted(r for r in want if not r.startswith(ACK_LINE))
    deliveries_had = sorted(r for r in have if not r.startswith(ACK_LINE))
    return deliveries_wanted == deliveries_had and acks_wanted - 1 <= acks_had <= acks_wanted


def only_reordered(failure: str) -> bool:
    """Whether a runner failure is a Testlog mismatch ("Expected: ... Got: ...") of the same deliveries."""
    head, _, rest = failure.partition("\nExpected:\n\n")
    expected, found, got = rest.partition("\n\n\nGot:\n\n")
    return head.startswith("ok(false)") and bool(found) and same_deliveries(expected, got)


def run_suite(root: Path, url: str, rawsocket_port: int, log: Path) -> dict[str, FileResult]:
    """Run every router file in turn against ``url`` and ``rawsocket_port``; the outcome of each."""
    return {name: run_file(root, name, url, rawsocket_port, log) for name in ROUTER_FILES}
