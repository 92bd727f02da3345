"""Failed logins slow the guesser, on a real node: a source is locked out, the real principal elsewhere is not.

The guesser is a raw WAMP client (the ``websockets`` library) sending HELLO
and a wrong ticket from 127.0.0.1; the real principal connects from
127.0.0.2 (another loopback address, bound before connecting). Rates are
shown by counting answers, never by timing: with a lockout of 60 s, every
attempt after the free ones and the one that started the lockout is refused.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.logins import FAILED, POLICY, TOO_MANY
from helpers.nodes import OPS_TOKEN, NodeProcess
from helpers.rawws import RECV_SECONDS
from websockets.sync.client import connect as ws_connect

pytestmark = pytest.mark.slow

FREE = 3


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """A node with a ticket policy, 3 free failures and a 60 s first lockout (and the TEP operator API)."""
    policy = tmp_path / "auth.toml"
    policy.write_text(POLICY)
    policy.chmod(0o600)
    proc = NodeProcess("guarded", tmp_path, frontends=True)
    proc.extra = (
        "--auth",
        str(policy),
        "--auth-failures-before-delay",
        str(FREE),
        "--auth-failure-delay",
        "60",
    )
    proc.start()
    yield proc
    proc.stop()


def from_address(source: str, port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port`` made from ``source`` (any 127/8 address is loopback)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(RECV_SECONDS)
    sock.connect(("127.0.0.1", port))
    return sock


def login(node: NodeProcess, ticket: str, source: str = "127.0.0.1") -> str:
    """HELLO as alice with ``ticket`` from ``source``: "welcome", or the ABORT reason."""
    sock = from_address(source, node.wamp_port)
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


def test_a_guessing_source_is_locked_out_and_the_real_principal_elsewhere_logs_in(node: NodeProcess) -> None:
    """3 free failures, a 4th that starts the lockout, then every guess refused unchecked; 127.0.0.2 still joins."""
    answers = [login(node, f"guess-{i}") for i in range(40)]
    assert answers[: FREE + 1] == [FAILED] * (FREE + 1)
    assert answers[FREE + 1 :] == [TOO_MANY] * (40 - FREE - 1)
    assert login(node, "the-real-ticket") == TOO_MANY  # the locked address is locked for everyone on it
    assert login(node, "the-real-ticket", source="127.0.0.2") == "welcome"
    logins = node.stats()["logins"]
    assert logins["failures"] == FREE + 1 and logins["refused"] == 40 - FREE - 1 + 1


def test_the_tep_operator_token_is_throttled_the_same_way(node: NodeProcess) -> None:
    """Wrong bearer tokens get 401, then 429 with Retry-After; the right token from 127.0.0.2 still works."""

    def post(token: str, source: str = "127.0.0.1") -> tuple[int, str | None]:
        conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=RECV_SECONDS, source_address=(source, 0))
        try:
            body = json.dumps({"payload": "hi"})
            conn.request("POST", "/tep/broadcast", body, {"Authorization": f"Bearer {token}"})
            response = conn.getresponse()
            response.read()
            return response.status, response.getheader("retry-after")
        finally:
            conn.close()

    statuses = [post(f"guess-{i}")[0] for i in range(10)]
    assert statuses == [401] * (FREE + 1) + [429] * (10 - FREE - 1)
    status, retry_after = post(OPS_TOKEN)
    assert status == 429 and retry_after is not None and 0 < int(retry_after) <= 60
    assert post(OPS_TOKEN, source="127.0.0.2") == (200, None)
