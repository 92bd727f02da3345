"""``--auth``: WAMP authentication and roles, and the same roles on TEP and NSD, on real node processes.

WAMP clients are Autobahn-Python sessions (their own ticket, WAMP-CRA and
cryptosign code answers the challenges) and autobahn-js under node; TEP
clients the independent ``websockets`` library; NSD clients plain sockets.
Absence is shown with a marker message sent after the refused one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.twisted.websocket import WampWebSocketClientFactory
from autobahn.wamp.auth import compute_wcs
from autobahn.wamp.cryptosign import CryptosignKey
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.serializer import JsonSerializer
from autobahn.wamp.types import ComponentConfig, SessionDetails
from helpers.nodes import REPO, Cluster, NodeProcess, start_cluster
from helpers.nsdclient import SUCCESS, NSDClient
from helpers.polling import WAIT_SECONDS, until
from helpers.rawws import RECV_SECONDS, close_of
from helpers.wampclient import TIMEOUT, leave, publish_acked, subscribe
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from websockets.sync.client import connect as ws_connect

from pubsubclub.cli import command as cli

pytestmark = pytest.mark.slow

NOT_AUTHORIZED = "wamp.error.not_authorized"
AUTHENTICATION_FAILED = "wamp.error.authentication_failed"

#: Carol's key, made fresh for this run with Autobahn's cryptosign helper.
CAROL = CryptosignKey.from_bytes(os.urandom(32))


def policy_text(anonymous: str) -> str:
    """The test policy: guest (anonymous), writer (alice, bob, carol), admin (root)."""
    return f"""\
anonymous = {anonymous}
[roles.guest]
subscribe = ["public."]
publish = ["public.chat."]
[roles.writer]
subscribe = [""]
publish = ["app.", "public."]
[roles.admin]
subscribe = [""]
publish = [""]
[[principals]]
authid = "alice"
role = "writer"
ticket = "s3cret"
[[principals]]
authid = "bob"
role = "writer"
wampcra = "bob-secret"
[[principals]]
authid = "carol"
role = "writer"
cryptosign = "{CAROL.public_key()}"
[[principals]]
authid = "root"
role = "admin"
ticket = "root-ticket"
"""


# -- an Autobahn-Python client that authenticates -------------------------------------------


class Aborted(Exception):
    """The router refused the session (ABORT)."""

    def __init__(self, reason: str, message: str | None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


async def join(
    url: str,
    *,
    authmethods: list[str] | None = None,
    authid: str | None = None,
    authextra: dict[str, Any] | None = None,
    answer: Callable[[Any], Any] | None = None,
) -> tuple[ApplicationSession, SessionDetails]:
    """A session joined to realm1 with these credentials, and its WELCOME details; Aborted if refused."""
    joined: defer.Deferred[tuple[ApplicationSession, SessionDetails]] = defer.Deferred()

    class Session(ApplicationSession):  # type: ignore[misc]
        def onConnect(self) -> None:
            self.join("realm1", authmethods=authmethods, authid=authid, authextra=authextra)

        def onChallenge(self, challenge: Any) -> Any:
            assert answer is not None, f"unexpected challenge {challenge}"
            return answer(challenge)

        def onJoin(self, details: SessionDetails) -> None:
            if not joined.called:
                joined.callback((self, details))

        def onLeave(self, details: Any) -> None:
            if not joined.called:
                joined.errback(Aborted(details.reason, details.message))
            super().onLeave(details)

    factory = WampWebSocketClientFactory(
        lambda: Session(ComponentConfig("realm1")), url=url, serializers=[JsonSerializer()]
    )
    port = int(url.split(":")[2].split("/")[0])
    await TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5).connect(factory)
    joined.addTimeout(TIMEOUT, reactor)
    return await joined


def ticket(authid: str, secret: str) -> dict[str, Any]:
    """join() arguments for WAMP-Ticket."""
    return {"authmethods": ["ticket"], "authid": authid, "answer": lambda challenge: secret}


def wampcra(authid: str, secret: str) -> dict[str, Any]:
    """join() arguments for WAMP-CRA, answered with Autobahn's compute_wcs."""
    return {
        "authmethods": ["wampcra"],
        "authid": authid,
        "answer": lambda challenge: compute_wcs(secret, challenge.extra["challenge"]).decode("ascii"),
    }


def cryptosign(authid: str | None, key: CryptosignKey) -> dict[str, Any]:
    """join() arguments for WAMP-cryptosign, signed with Autobahn's CryptosignKey."""
    return {
        "authmethods": ["cryptosign"],
        "authid": authid,
        "authextra": {"pubkey": key.public_key()},
        "answer": key.sign_challenge,
    }


async def refused(coro: Any) -> str:
    """The WAMP error of an awaited call that must fail."""
    with pytest.raises(ApplicationError) as caught:
        await coro
    return str(caught.value.error)


def identity(details: SessionDetails) -> tuple[str | None, str | None, str | None]:
    """WELCOME's authid, authrole, authmethod."""
    return details.authid, details.authrole, details.authmethod


# -- nodes ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The policy with anonymous guests, and the same with anonymous refused."""
    folder = tmp_path_factory.mktemp("auth")
    open_policy, closed_policy = folder / "open.toml", folder / "closed.toml"
    open_policy.write_text(policy_text('"guest"'))
    open_policy.chmod(0o600)
    closed_policy.write_text(policy_text("false"))
    closed_policy.chmod(0o644)  # readable by everyone: the node warns
    return open_policy, closed_policy


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, policy_files: tuple[Path, Path]) -> Iterator[Cluster]:
    """Two linked nodes with the open policy, WAMP, TEP and NSD."""
    cluster = start_cluster(tmp_path_factory.mktemp("pair"), 2, extra=("--auth", str(policy_files[0])), frontends=True)
    try:
        cluster.wait_linked()
        yield cluster
    finally:
        for node in cluster.nodes:
            node.stop()


@pytest.fixture(scope="module")
def closed(tmp_path_factory: pytest.TempPathFactory, policy_files: tuple[Path, Path]) -> Iterator[NodeProcess]:
    """One node refusing anonymous clients; its WAMP listener on 0.0.0.0 (tests connect to 127.0.0.1)."""
    node = NodeProcess("closed", tmp_path_factory.mktemp("closed"), frontends=True)
    node.extra = ("--auth", str(policy_files[1]), "--wamp", f"tcp:{node.wamp_port}:interface=0.0.0.0")
    node.start()
    try:
        yield node
    finally:
        node.stop()


def interest(node: NodeProcess, topic: str) -> list[str]:
    """Which peer nodes asked ``node`` for ``topic``."""
    return list(node.stats()["remote_interest"].get(topic, []))


# -- authentication --------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_anonymous_session_is_welcomed_with_the_anonymous_role(pair: Cluster) -> None:
    """A HELLO without credentials gets WELCOME authid anonymous, authrole guest, authmethod anonymous."""
    session, details = await join(pair[0].wamp_url)
    assert identity(details) == ("anonymous", "guest", "anonymous")
    await leave(session)


@pytest_twisted.ensureDeferred
async def test_anonymous_refused_when_the_policy_says_false(closed: NodeProcess) -> None:
    """With anonymous = false a HELLO without credentials gets ABORT not_authorized; credentials still work."""
    with pytest.raises(Aborted) as caught:
        await join(closed.wamp_url)
    assert caught.value.reason == NOT_AUTHORIZED
    session, details = await join(closed.wamp_url, **ticket("alice", "s3cret"))
    assert identity(details) == ("alice", "writer", "ticket")
    await leave(session)


@pytest_twisted.ensureDeferred
async def test_ticket_right_wrong_and_unknown_authid(pair: Cluster) -> None:
    """The right ticket is welcomed as alice/writer/ticket; a wrong one fails; an unknown authid is not authorized."""
    session, details = await join(pair[0].wamp_url, **ticket("alice", "s3cret"))
    assert identity(details) == ("alice", "writer", "ticket")
    assert details.authprovider == "static"
    await leave(session)
    with pytest.raises(Aborted) as caught:
        await join(pair[0].wamp_url, **ticket("alice", "s3cret?"))
    assert caught.value.reason == AUTHENTICATION_FAILED
    with pytest.raises(Aborted) as caught:
        await join(pair[0].wamp_url, **ticket("mallory", "s3cret"))
    assert caught.value.reason == NOT_AUTHORIZED


@pytest_twisted.ensureDeferred
async def test_wampcra_right_and_wrong(pair: Cluster) -> None:
    """WAMP-CRA with the right secret is welcomed as bob/writer/wampcra; a wrong secret fails authentication."""
    session, details = await join(pair[1].wamp_url, **wampcra("bob", "bob-secret"))
    assert identity(details) == ("bob", "writer", "wampcra")
    await leave(session)
    with pytest.raises(Aborted) as caught:
        await join(pair[1].wamp_url, **wampcra("bob", "bob-secreT"))
    assert caught.value.reason == AUTHENTICATION_FAILED


@pytest_twisted.ensureDeferred
async def test_cryptosign_right_and_wrong_key(pair: Cluster) -> None:
    """Carol's Ed25519 key is welcomed (by authid or by key alone); another key fails authentication."""
    session, details = await join(pair[0].wamp_url, **cryptosign("carol", CAROL))
    assert identity(details) == ("carol", "writer", "cryptosign")
    await leave(session)
    session, details = await join(pair[0].wamp_url, **cryptosign(None, CAROL))
    assert identity(details) == ("carol", "writer", "cryptosign")
    await leave(session)
    with pytest.raises(Aborted) as caught:
        await join(pair[0].wamp_url, **cryptosign("carol", CryptosignKey.from_bytes(os.urandom(32))))
    assert caught.value.reason == AUTHENTICATION_FAILED


# -- authorization ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_refused_subscribe_and_publish_deliver_nothing(pair: Cluster) -> None:
    """A guest's SUBSCRIBE/PUBLISH outside its prefixes get ERROR not_authorized; only the later marker arrives."""
    guest, _ = await join(pair[0].wamp_url)
    writer, _ = await join(pair[0].wamp_url, **ticket("alice", "s3cret"))
    assert await refused(guest.subscribe(lambda *a: None, "app.news")) == NOT_AUTHORIZED
    rec, _ = await subscribe(writer, "app.news")
    assert await refused(publish_acked(guest, "app.news", "forbidden")) == NOT_AUTHORIZED
    guest.publish("app.news", "forbidden, unacknowledged")
    root, _ = await join(pair[0].wamp_url, **ticket("root", "root-ticket"))
    await publish_acked(root, "app.news", "marker")
    await rec.wait_until(lambda r: "marker" in r.args)
    assert rec.args == ["marker"]
    await leave(guest, writer, root)


@pytest_twisted.ensureDeferred
async def test_refused_publish_is_not_forwarded_to_other_nodes(pair: Cluster) -> None:
    """A guest publish refused on node 1 never reaches node 2; an allowed guest publish does, and so does the marker."""
    node1, node2 = pair[0], pair[1]
    reader, _ = await join(node2.wamp_url)  # a guest may read public.*
    news, _ = await subscribe(reader, "public.news")
    chat, _ = await subscribe(reader, "public.chat.room")
    await until(
        lambda: interest(node1, "public.news") == ["node2"] and interest(node1, "public.chat.room") == ["node2"],
        "node1 to learn node2's interest",
    )
    guest, _ = await join(node1.wamp_url)
    assert await refused(publish_acked(guest, "public.news", "forbidden")) == NOT_AUTHORIZED
    await publish_acked(guest, "public.chat.room", "hello from a guest")
    writer, _ = await join(node1.wamp_url, **ticket("alice", "s3cret"))
    await publish_acked(writer, "public.news", "marker")
    await news.wait_until(lambda r: "marker" in r.args)
    await chat.wait_for(1)
    assert news.args == ["marker"]
    assert chat.args == ["hello from a guest"]
    await leave(reader, guest, writer)


@pytest_twisted.ensureDeferred
async def test_empty_prefix_means_every_topic(pair: Cluster) -> None:
    """Role admin ("" for both) publishes anywhere and writer ("" subscribe) reads anywhere; a guest cannot."""
    writer, _ = await join(pair[1].wamp_url, **wampcra("bob", "bob-secret"))
    rec, _ = await subscribe(writer, "zzz.any.topic")
    root, _ = await join(pair[1].wamp_url, **ticket("root", "root-ticket"))
    await publish_acked(root, "zzz.any.topic", "anywhere")
    await rec.wait_for(1)
    assert rec.args == ["anywhere"]
    guest, _ = await join(pair[1].wamp_url)
    assert await refused(guest.subscribe(lambda *a: None, "zzz.any.topic")) == NOT_AUTHORIZED
    await leave(writer, root, guest)


# -- TEP and NSD ---------------------------------------------------------------------------


def tep_recv(ws: Any) -> Any:
    """The next TEP frame, decoded (bounded wait)."""
    return json.loads(ws.recv(timeout=RECV_SECONDS))


@pytest_twisted.ensureDeferred
async def test_tep_clients_have_the_anonymous_role(pair: Cluster) -> None:
    """TEP: joins outside the guest's subscribe prefixes come back in #join, refused publishes get #error."""
    node = pair[0]
    writer, _ = await join(node.wamp_url, **ticket("alice", "s3cret"))
    app, _ = await subscribe(writer, "app.b")
    chat, _ = await subscribe(writer, "public.chat.t")
    with ws_connect(node.tep_url, open_timeout=5, close_timeout=2) as ws:
        ws.send(json.dumps({"topic": "join", "payload": ["public.a", "app.b"]}))
        assert tep_recv(ws) == {"topic": "@join", "payload": ["public.a"]}
        assert tep_recv(ws) == {"topic": "#join", "payload": ["app.b"]}
        ws.send(json.dumps({"topic": "app.b", "payload": "forbidden"}))
        error = tep_recv(ws)
        assert error["topic"] == "#error"
        assert error["payload"]["error"] == "not authorized: role 'guest' may not publish to channel 'app.b'"
        ws.send(json.dumps({"topic": "public.chat.t", "payload": "from tep"}))
        await chat.wait_for(1)
        # Another session: a publisher does not get its own events.
        root, _ = await join(node.wamp_url, **ticket("root", "root-ticket"))
        await publish_acked(root, "app.b", "marker")
        await publish_acked(root, "public.a", "to tep")
        assert tep_recv(ws) == {"topic": "public.a", "payload": "to tep"}
    await app.wait_for(1)
    assert app.args == ["marker"]
    assert chat.args == ["from tep"]
    await leave(writer, root)


def test_tep_client_refused_when_anonymous_is_refused(closed: NodeProcess) -> None:
    """anonymous = false: a TEP client gets one #error frame, then close code 3000 (Unauthorized)."""
    with ws_connect(closed.tep_url, open_timeout=5, close_timeout=2) as ws:
        frame = tep_recv(ws)
        assert frame["topic"] == "#error" and frame["payload"]["error"].startswith("not authorized")
        code, reason = close_of(ws)
    assert code == 3000 and reason is not None and "not authorized" in reason


@pytest_twisted.ensureDeferred
async def test_nsd_clients_have_the_anonymous_role(pair: Cluster) -> None:
    """NSD: Open/Publish/Subscribe outside the guest's prefixes are NOT AUTHORIZED; allowed ones work."""
    node = pair[1]
    writer, _ = await join(node.wamp_url, **ticket("alice", "s3cret"))
    rec, _ = await subscribe(writer, "public.chat.me")
    me = NSDClient(node.nsd_port, "public.chat.me")
    room = NSDClient(node.nsd_port, "public.room")
    app = NSDClient(node.nsd_port, "app.me")
    try:
        assert me.open() == SUCCESS
        assert me.publish("hello") == SUCCESS
        await rec.wait_for(1)
        assert rec.events[0][0][0]["body"] == "hello"
        assert app.open()["error"] == "NOT AUTHORIZED: role 'guest' may neither publish nor subscribe to channel app.me"
        assert me.subscribe("app.x")["error"] == "NOT AUTHORIZED: role 'guest' may not subscribe to channel app.x"
        assert room.open() == SUCCESS  # the guest may read public.room, not write it
        assert room.publish("nope")["error"] == "NOT AUTHORIZED: role 'guest' may not publish to channel public.room"
        assert room.subscribe("public.chat.me") == SUCCESS
        assert [m["body"] for m in room.get()] == ["hello"]
    finally:
        for client in (me, room, app):
            client.close()
    await leave(writer)


def test_nsd_client_refused_when_anonymous_is_refused(closed: NodeProcess) -> None:
    """anonymous = false: an NSD request gets ErrorResponse NOT AUTHORIZED and the connection is closed."""
    client = NSDClient(closed.nsd_port, "public.me")
    try:
        answer = client.open()
        assert answer["_class"] == "ErrorResponse" and answer["error"].startswith("NOT AUTHORIZED: ")
        assert client.sock.recv(1) == b""
    finally:
        client.close()


# -- autobahn-js ------------------------------------------------------------------------------


def run_js(url: str, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    """Run tests/js/wamp_client.js to completion: exit code, stdout JSON lines, stderr."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js) is not on PATH: the JS client tests need it (see the Makefile's js target)")
    result = subprocess.run(
        [node, str(REPO / "tests" / "js" / "wamp_client.js"), "--url", url, *args, "--timeout", "15"],
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
        cwd=REPO,
    )
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines() if line.strip()], result.stderr


def test_autobahn_js_ticket_and_wampcra(pair: Cluster) -> None:
    """autobahn-js: right ticket / WAMP-CRA secret join (WELCOME details) and publish; a wrong ticket is aborted."""
    url = pair[0].wamp_url
    rc, lines, err = run_js(url, "--authid", "alice", "--ticket", "s3cret", "publish", "--topic", "app.js")
    assert rc == 0, err
    assert lines == [{"joined": {"authid": "alice", "authrole": "writer", "authmethod": "ticket"}}, {"published": 1}]
    rc, lines, err = run_js(url, "--authid", "bob", "--secret", "bob-secret", "publish", "--topic", "app.js")
    assert rc == 0, err
    assert lines[0] == {"joined": {"authid": "bob", "authrole": "writer", "authmethod": "wampcra"}}
    rc, lines, err = run_js(url, "--authid", "alice", "--ticket", "wrong", "publish", "--topic", "app.js")
    assert rc == 1 and lines == []
    assert AUTHENTICATION_FAILED in err


# -- the file and the warning -------------------------------------------------------------------


def test_bad_auth_file_stops_the_node_with_exit_2_naming_the_line(tmp_path: Path) -> None:
    """A policy file with a TOML syntax error ends ``pubsubclub node`` with exit code 2 and the line."""
    bad = tmp_path / "auth.toml"
    bad.write_text(policy_text('"guest"').replace("[roles.writer]", "[roles.writer"))
    result = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "node", "--auth", str(bad)],
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
        cwd=REPO,
    )
    assert result.returncode == 2, result
    assert f"config key 'auth': {bad} line 5: invalid TOML" in result.stderr


@pytest.mark.parametrize(
    ("old", "new", "line", "words"),
    [
        ('role = "writer"', 'role = "wrtier"', 13, "unknown role 'wrtier'"),
        ('ticket = "s3cret"', 'ticket = "s3cret"\nwampcra = "x"', 15, "has 2 credentials"),
        ('ticket = "s3cret"', "", 11, "has no credential"),
        # The key is made at import: a fixed id keeps the test's name the same in every
        # process (pytest-xdist workers must collect the same names).
        pytest.param(f'"{CAROL.public_key()}"', '"not-hex"', 22, "64 hex characters", id="key-not-hex"),
        ('publish = ["public.chat."]', 'publish = "public.chat."', 4, "must be a list"),
        ('anonymous = "guest"', 'anonymous = "visitor"', 1, "not defined"),
    ],
)
def test_schema_errors_exit_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, line: int, words: str
) -> None:
    """Schema errors (unknown role, two or no credentials, bad key, wrong types) exit 2 naming the line."""
    text = policy_text('"guest"')
    assert old in text
    bad = tmp_path / "auth.toml"
    bad.write_text(text.replace(old, new, 1))
    assert cli.main(["node", "--auth", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"config key 'auth': {bad} line {line}: " in err and words in err


def test_auth_key_in_the_node_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``auth = "FILE"`` in the node's TOML config works like --auth (here: its error names the policy's line)."""
    bad = tmp_path / "auth.toml"
    bad.write_text(policy_text('"guest"').replace('role = "admin"', 'role = "root"'))
    config = tmp_path / "node.toml"
    config.write_text(f'auth = "{bad}"\n')
    assert cli.main(["node", "--config", str(config)]) == 2
    assert f"{bad} line 25: principal 'root': unknown role 'root'" in capsys.readouterr().err


def test_security_warning_when_wamp_binds_beyond_loopback_without_auth(
    tmp_path: Path, closed: NodeProcess, pair: Cluster
) -> None:
    """--wamp on 0.0.0.0 without --auth logs a SECURITY WARNING naming --auth; with --auth there is none.

    A policy file holding secrets that every user may read is warned about too (chmod 600 silences it).
    """
    node = NodeProcess("open", tmp_path)
    node.extra = ("--wamp", f"tcp:{node.wamp_port}:interface=0.0.0.0")
    node.start()
    try:
        warnings = [line for line in node.log_path.read_text().splitlines() if "no --auth" in line]
    finally:
        node.stop()
    assert len(warnings) == 1, warnings
    assert "SECURITY WARNING" in warnings[0] and "wamp" in warnings[0]
    closed_log = closed.log_path.read_text()
    assert "no --auth" not in closed_log
    assert "SECURITY WARNING" in closed_log and "chmod 600" in closed_log
    assert "chmod 600" not in pair[0].log_path.read_text()
