"""Failed logins are counted node-wide on a node with ``--workers 2`` (federation/logins.py).

One real 2-worker node with a ticket policy, 3 free failures and a 60 s
first lockout, shared by the module's tests; each test guesses from its own
loopback address (127.0.0.x). Which worker answered a login is read from the
node's /stats (each worker's ``logins`` counters: ``failures`` and
``refused`` count the attempts it answered itself, ``replicated`` the
failures it learned from the other). The kernel picks the worker per
connection, so attempts are repeated until each worker has answered; the
kill -9 tests run last, the flood (which fills the small table) at the end.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.logins import FAILED, POLICY, TOO_MANY
from helpers.nodes import OPS_TOKEN, NodeProcess, share_logs, unshare_logs
from helpers.polling import wait_until
from helpers.rawws import RECV_SECONDS
from websockets.sync.client import connect as ws_connect

pytestmark = pytest.mark.slow

FREE = 3
#: Sources the node remembers (``--auth-max-sources``): small, so the flood test fills it.
MAX_SOURCES = 40
#: Most attempts made to have each worker answer once (each lands on a worker with a chance of 1/2).
MAX_TRIES = 40


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A 2-worker node: ticket policy, 3 free failures, a 60 s first lockout, the TEP operator API."""
    tmp: Path = tmp_path_factory.mktemp("workers-logins")
    policy = tmp / "auth.toml"
    policy.write_text(POLICY)
    policy.chmod(0o600)
    token = tmp / "ops-token"
    token.write_text(OPS_TOKEN + "\n")
    token.chmod(0o600)
    proc = NodeProcess("wl", tmp)
    proc.extra = (
        "--workers", "2", "--shutdown-timeout", "3", "--auth", str(policy),
        "--auth-failures-before-delay", str(FREE), "--auth-failure-delay", "60",
        "--auth-max-sources", str(MAX_SOURCES),
        "--tep", "tcp:0:interface=127.0.0.1", "--tep-ops-token-file", str(token),
    )  # fmt: skip
    proc.start()
    share_logs([proc])
    try:
        yield proc
    finally:
        proc.stop()
        unshare_logs([proc])


def logins(node: NodeProcess) -> list[dict[str, Any]]:
    """Each worker's ``logins`` counters (an empty dict for a worker that does not answer)."""
    try:
        rows = node.stats()["workers"]
    except OSError:
        return [{}, {}]
    return [row.get("logins") or {} for row in rows]


def answered(row: dict[str, Any]) -> int:
    """Login attempts a worker answered itself (checked and failed, or refused unchecked)."""
    return int(row.get("failures", 0)) + int(row.get("refused", 0))


def seen(row: dict[str, Any]) -> int:
    """Failures a worker counted: its own and those learned from the other."""
    return int(row.get("failures", 0)) + int(row.get("replicated", 0))


def login(node: NodeProcess, source: str, ticket: str = "a wrong guess") -> str:
    """HELLO as alice with ``ticket`` from ``source``: "welcome", or the ABORT reason."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(RECV_SECONDS)
    sock.connect(("127.0.0.1", node.wamp_port))
    with ws_connect(node.wamp_url, sock=sock, subprotocols=["wamp.2.json"], open_timeout=5, close_timeout=2) as ws:
        ws.send(json.dumps([1, "realm1", {"roles": {"subscriber": {}}, "authmethods": ["ticket"], "authid": "alice"}]))
        answer = json.loads(ws.recv(timeout=RECV_SECONDS))
        if answer[0] == 4:  # CHALLENGE
            ws.send(json.dumps([5, ticket, {}]))
            answer = json.loads(ws.recv(timeout=RECV_SECONDS))
    if answer[0] == 2:
        return "welcome"
    assert answer[0] == 3, answer  # ABORT
    return str(answer[2])


def attempt(node: NodeProcess, source: str) -> tuple[str, int]:
    """A wrong ticket from ``source``: the answer, and the worker that gave it."""
    before = [answered(row) for row in logins(node)]
    answer = login(node, source)
    after = [answered(row) for row in logins(node)]
    moved = [i for i in range(len(after)) if after[i] != before[i]]
    assert len(moved) == 1, (before, after)
    return answer, moved[0]


def on_both_workers(node: NodeProcess, source: str) -> list[tuple[str, int]]:
    """Wrong tickets from ``source`` until each worker answered one (at most :data:`MAX_TRIES`)."""
    answers: list[tuple[str, int]] = []
    while {worker for _, worker in answers} != {0, 1}:
        assert len(answers) < MAX_TRIES, answers
        answers.append(attempt(node, source))
    return answers


def operator_post(node: NodeProcess, token: str, source: str) -> tuple[int, str | None]:
    """POST /tep/broadcast with ``token`` from ``source``: the status and Retry-After."""
    conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=RECV_SECONDS, source_address=(source, 0))
    try:
        conn.request("POST", "/tep/broadcast", json.dumps({"payload": "hi"}), {"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        return response.status, response.getheader("retry-after")
    finally:
        conn.close()


def same_sources(node: NodeProcess) -> bool:
    """Whether both workers answer and hold as many sources (one holds every source the other does)."""
    rows = logins(node)
    return rows[0].get("sources") is not None and rows[0].get("sources") == rows[1].get("sources")


def linked(node: NodeProcess) -> bool:
    """Whether both workers are linked both ways (False while the primary's ops listener is down)."""
    try:
        return bool(node.health()[1]["workers"]["linked"] == 2)
    except OSError:
        return False


def wait_counted(node: NodeProcess, before: list[dict[str, Any]], failures: int) -> None:
    """Wait until each worker counted ``failures`` more than in ``before`` (its own and the other's)."""
    wait_until(
        lambda: [seen(row) - seen(old) for row, old in zip(logins(node), before, strict=True)] == [failures] * 2,
        f"each worker to count {failures} more failures",
    )


def test_failures_spread_over_both_workers_lock_the_source_out_on_both(node: NodeProcess) -> None:
    """3 free failures + 1 in total, wherever they land: then every attempt on either worker is refused."""
    source = "127.0.0.11"
    before = logins(node)
    first: list[tuple[str, int]] = []
    failures = 0
    while failures < FREE + 1:
        assert len(first) < MAX_TRIES, first
        first.append(attempt(node, source))
        if first[-1][0] == FAILED:
            failures += 1
            wait_counted(node, before, failures)
    # The free ones were checked wherever they landed; past them, worker 1 refused unchecked (the primary checks).
    assert [answer for answer, _ in first[:FREE]] == [FAILED] * FREE
    assert first[-1] == (FAILED, 0)
    assert all(answer == TOO_MANY and worker == 1 for answer, worker in first[FREE:-1]), first
    answers = on_both_workers(node, source)
    assert [answer for answer, _ in answers] == [TOO_MANY] * len(answers), (first, answers)
    # The operator API (the primary's) refuses that source too.
    assert operator_post(node, OPS_TOKEN, source)[0] == 429
    assert login(node, "127.0.0.12", "the-real-ticket") == "welcome"  # another address is not affected


def test_operator_api_failures_lock_wamp_logins_on_every_worker(node: NodeProcess) -> None:
    """Wrong operator tokens on the primary (401, 401, 401, 401, then 429) lock the source's WAMP logins on both."""
    source = "127.0.0.13"
    before = logins(node)
    statuses = [operator_post(node, f"guess-{i}", source)[0] for i in range(FREE + 2)]
    assert statuses == [401] * (FREE + 1) + [429]
    wait_counted(node, before, FREE + 1)
    answers = on_both_workers(node, source)
    assert [answer for answer, _ in answers] == [TOO_MANY] * len(answers), answers


def test_past_its_free_failures_a_source_is_checked_by_the_primary_alone(node: NodeProcess) -> None:
    """3 free failures and no lockout yet: worker 1 refuses the source unchecked, the primary checks one guess."""
    for n in range(12):  # until a source's first login lands on worker 1 (a chance of 1/2 each)
        source = f"127.0.0.{20 + n}"
        before = logins(node)
        assert [operator_post(node, f"guess-{i}", source)[0] for i in range(FREE)] == [401] * FREE
        wait_counted(node, before, FREE)
        answer, worker = attempt(node, source)
        if worker == 1:
            break
    else:
        raise AssertionError("no source's first login landed on worker 1")
    assert answer == TOO_MANY  # though no lockout started: a guess past the free ones is the primary's to check
    answers = on_both_workers(node, source)
    on_primary = [answer for answer, worker in answers if worker == 0]
    on_worker = [answer for answer, worker in answers if worker == 1]
    assert on_primary == [FAILED] + [TOO_MANY] * (len(on_primary) - 1), answers
    assert on_worker == [TOO_MANY] * len(on_worker), answers


def test_a_killed_worker_comes_back_with_the_nodes_lockouts(node: NodeProcess) -> None:
    """kill -9 of worker 1: the restarted worker gets the table from the primary and refuses the locked source."""
    source = "127.0.0.14"
    before = logins(node)
    assert [operator_post(node, f"guess-{i}", source)[0] for i in range(FREE + 1)] == [401] * (FREE + 1)
    wait_counted(node, before, FREE + 1)
    old_pid = node.stats()["workers"][1]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: node.stats()["workers"][1].get("pid") not in (None, old_pid), "worker 1 restarted")
    wait_until(lambda: linked(node), "worker 1 linked to the primary")
    wait_until(lambda: same_sources(node), "worker 1 to hold every source")
    answers = on_both_workers(node, source)
    assert [answer for answer, _ in answers] == [TOO_MANY] * len(answers), answers


def test_a_killed_primary_comes_back_with_the_nodes_lockouts(node: NodeProcess) -> None:
    """kill -9 of the primary: the restarted primary gets the table from worker 1; its operator API answers 429."""
    source = "127.0.0.15"
    before = logins(node)
    assert [operator_post(node, f"guess-{i}", source)[0] for i in range(FREE + 1)] == [401] * (FREE + 1)
    wait_counted(node, before, FREE + 1)
    old_pid = node.stats()["workers"][0]["pid"]
    os.kill(old_pid, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return node.stats()["workers"][0].get("pid") not in (None, old_pid)
        except OSError:
            return False  # the ops listener is the primary's: down while it restarts

    wait_until(restarted, "worker 0 restarted")
    wait_until(lambda: linked(node), "worker 1 linked to the new primary")
    wait_until(lambda: same_sources(node), "the new primary to hold every source")
    status, retry_after = operator_post(node, OPS_TOKEN, source)
    assert status == 429 and retry_after is not None and 0 < int(retry_after) <= 60
    answers = on_both_workers(node, source)
    assert [answer for answer, _ in answers] == [TOO_MANY] * len(answers), answers


def test_a_flood_from_many_addresses_stays_within_the_cap_on_every_worker(node: NodeProcess) -> None:
    """Failures from 2x --auth-max-sources addresses on the primary: both workers hold at most the cap, full."""
    before = logins(node)
    for i in range(2 * MAX_SOURCES):
        assert operator_post(node, "a wrong guess", f"127.0.1.{i + 1}")[0] == 401
    wait_counted(node, before, 2 * MAX_SOURCES)
    rows = logins(node)
    assert [row["sources"] for row in rows] == [MAX_SOURCES] * 2
    assert all(row["forgotten_early"] > old.get("forgotten_early", 0) for row, old in zip(rows, before, strict=True))
