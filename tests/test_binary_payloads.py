"""Binary payloads cross the links (issue 18, "nothing acknowledged is lost across nodes"; PSC 0.6).

A WAMP PUBLISH holding bytes (MessagePack ``bin``, or JSON's ``"\\0"`` +
base64 strings, which the broker reads as bytes) is carried on PSC 0.6 links
with its bytes in WAMP's JSON convention and ``"b": 1`` in the metadata, and
arrives as bytes on the other node: real bytes to MessagePack subscribers, the
``"\\0"`` + base64 string (which Autobahn reads back as bytes) to JSON ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import pytest_twisted
from autobahn.exception import PayloadExceededError
from autobahn.wamp.types import PublishOptions
from helpers.bigpublish import FOLLOWERS as SIZE_FOLLOWERS
from helpers.bigpublish import publish_big_then_followers
from helpers.nodes import Cluster, interest_reached, share_logs, start_cluster, unshare_logs
from helpers.wampclient import connect, leave, subscribe
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer

from pubsubclub.core import binaryjson
from pubsubclub.federation import psc
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.testing import MemoryNetwork, RecordingSink, no_logged_errors, psc_url

ACK = PublishOptions(acknowledge=True)
#: Messages published after the binary one; every one must arrive too.
FOLLOWERS = 20
ARGS = [b"\x00\xff\x01binary", "text", 7]
KWARGS = {"blob": {"nested": [b"", b"\x80\x81"], "n": None}, "s": "plain"}


# -- the carrier: exact round trips ----------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.binary()
    # The ambiguous case: strings that start with NUL, some of them valid base64 after it.
    | st.builds(lambda s: "\x00" + s, st.text() | st.sampled_from(["", "AA==", "!", "!x", "\x00"]))
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(_values)
def test_any_value_with_bytes_and_nul_strings_round_trips_exactly_through_json(value: Any) -> None:
    """``from_json(loads(dumps(to_json(v)))) == v`` for nested values of bytes, strings starting with NUL and JSON."""
    carried = orjson.loads(orjson.dumps(binaryjson.to_json(value)))
    assert binaryjson.from_json(carried) == value


@given(_values, st.booleans(), st.integers(1, 2**53 - 1))
def test_binary_psc301_round_trips_with_its_metadata(value: Any, wrapped: bool, seq: int) -> None:
    """A 0.6 PSC301 (``"b": 1``) decodes to the same message, bytes as bytes, with and without a sequence number."""
    data = psc.encode_publish_meta("t", value, "n1", 12.5, "n1-1", wrapped, binary=True)
    meta = psc.Meta("n1", 12.5, "n1-1", wrapped, None, True)
    assert psc.decode(data) == psc.Publish("t", value, meta)
    numbered = psc.decode(psc.with_seq(data, seq))
    assert numbered == psc.Publish("t", value, psc.Meta("n1", 12.5, "n1-1", wrapped, seq, True))


def test_carrier_wire_form_is_wamp_json_and_marks_nul_strings() -> None:
    """Bytes are written ``"\\0"`` + base64 as WAMP JSON does; a string starting with NUL gets ``"\\0!"``."""
    data = psc.encode_publish_meta("t", [b"\x01\x02", "\x00QUJD", "x"], "n", None, None, binary=True)
    assert data == b'[301,"t",["\\u0000AQI=","\\u0000!QUJD","x"],{"o":"n","b":1}]'
    # Without the flag (every version before 0.6, and JSON messages) nothing is converted.
    assert psc.decode(b'[301,"t",["\\u0000AQI="],{"o":"n"}]').message == ["\x00AQI="]


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (b'[301,"t",["\\u0000not base64!"],{"b":1}]', "not valid base64"),
        (b'[301,"t",["\\u0000AQI"],{"b":1}]', "not valid base64"),
    ],
)
def test_bad_base64_in_a_binary_psc301_drops_that_message_only(frame: bytes, problem: str) -> None:
    """A flagged PSC301 whose NUL string is not base64 is that message's problem (PSCPayloadError), not the link's."""
    with pytest.raises(psc.PSCPayloadError, match=problem):
        psc.decode(frame)


@pytest.mark.parametrize("flag", [b"2", b"true", b'"1"'])
def test_binary_flag_other_than_1_is_a_protocol_error(flag: bytes) -> None:
    """Metadata ``"b"`` must be the integer 1."""
    with pytest.raises(psc.PSCDecodeError, match="'b' must be 1"):
        psc.decode(b'[301,"t",1,{"b":%s}]' % flag)


def test_rendering_for_text_front_ends_writes_bytes_as_wamp_json() -> None:
    """:func:`binaryjson.dumps` writes bytes as ``"\\0"`` + base64 and leaves strings alone."""
    assert binaryjson.dumps({"a": [b"\xff"], "s": "\x00x"}) == b'{"a":["\\u0000/w=="],"s":"\\u0000x"}'


# -- links in memory: 0.6 carries binary, older links do not get it --------------------------------

REPLAY = ReplaySettings(max_bytes=1024 * 1024, window=60.0)


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    """An in-memory network; the test fails if anything logged an error."""
    with no_logged_errors():
        yield MemoryNetwork()


def test_0_6_link_carries_bytes_and_an_older_link_gets_only_json(net: MemoryNetwork) -> None:
    """Producer b with a 0.6 consumer a and a 0.4 consumer c: a gets the bytes, c only the JSON marker after them."""
    a = net.node("a", 9001, replay=REPLAY)
    b = net.node("b", 9002, replay=REPLAY)
    c = net.node("c", 9003, replay=REPLAY, patterns=False)
    got_a, got_c = RecordingSink(), RecordingSink()
    a.hub.subscribe("t", got_a)
    c.hub.subscribe("t", got_c)
    for consumer in (a, c):
        consumer.add_server(psc_url(9002))
    net.answer()
    assert sorted((r["peer_node"], r["version"]) for r in b.links()) == [("a", "0.8"), ("c", "0.4")]
    payload = {"args": ARGS, "kwargs": KWARGS}
    b.hub.publish(b.hub.envelope("t", payload, wamp_wrapped=True))
    b.hub.publish(b.hub.envelope("t", "marker"))
    net.flush()
    assert [e.payload for e in got_a.got] == [payload, "marker"]
    assert got_a.got[0].wamp_wrapped
    assert [e.payload for e in got_c.got] == ["marker"]
    assert b.stats["dropped_not_json"] == 1
    net.stop()


# -- two real nodes ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two linked nodes, shared by the module's real-node tests (each has topics of its own)."""
    cluster = start_cluster(tmp_path_factory.mktemp("binary"), 2)
    share_logs(cluster.nodes)
    try:
        yield cluster
    finally:
        for node in cluster.nodes:
            node.stop()
        unshare_logs(cluster.nodes)


@pytest.mark.slow
@pytest.mark.parametrize("publisher", ["msgpack", "json"])
@pytest_twisted.ensureDeferred
async def test_binary_publish_on_a_reaches_msgpack_and_json_subscribers_on_b(pair: Cluster, publisher: str) -> None:
    """Bytes in args and nested in kwargs, published on A, arrive exactly on B with both serializers; then 20 more."""
    cluster = pair
    await cluster.linked()
    a, b = cluster[0], cluster[1]
    topic = f"bin.{publisher}"
    sub_msgpack = await connect(b.wamp_url, serializer="msgpack")
    sub_json = await connect(b.wamp_url, serializer="json")
    rec_msgpack, _ = await subscribe(sub_msgpack, topic)
    rec_json, _ = await subscribe(sub_json, topic)
    await interest_reached(a, b, topic)
    pub = await connect(a.wamp_url, serializer=publisher)
    # Autobahn's JSON serializer writes the bytes as "\0" + base64; the broker reads them back as bytes.
    await pub.publish(topic, *ARGS, options=ACK, **KWARGS)
    await defer.gatherResults([pub.publish(topic, i, options=ACK) for i in range(FOLLOWERS)])
    expected: list[tuple[tuple[Any, ...], dict[str, Any]]] = [(tuple(ARGS), KWARGS)]
    expected += [((i,), {}) for i in range(FOLLOWERS)]
    for rec in (rec_msgpack, rec_json):
        await rec.wait_for(1 + FOLLOWERS)
        assert rec.events == expected
        assert type(rec.events[0][0][0]) is bytes
    assert a.stats()["federation"]["dropped_not_json"] == 0
    await leave(pub, sub_msgpack, sub_json)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_binary_publish_whose_base64_would_not_fit_the_link_is_refused_before_published(pair: Cluster) -> None:
    """1,000,000 MessagePack bytes (under the 1 MiB limit, 1.33 MB as base64) get ERROR, never PUBLISHED; 20 follow."""
    cluster = pair
    await cluster.linked()
    refused, got = await publish_big_then_followers(cluster, "bin.big", "msgpack", b"\xff" * 1_000_000)
    assert isinstance(refused, PayloadExceededError), "acknowledged, but it cannot reach the other node"
    assert "over the link limit of 1114112 bytes" in str(refused), refused
    assert got == list(range(SIZE_FOLLOWERS))


# -- front-ends without a binary type render bytes as WAMP JSON does --------------------------------


def test_tep_sysv_stream_and_nsd_render_bytes_as_wamp_json_strings() -> None:
    """A payload holding bytes reaches TEP, SysV, stream and NSD as ``"\\u0000"`` + base64 strings, not dropped."""
    from pubsubclub.frontends.nsd import codec as nsd_codec
    from pubsubclub.frontends.nsd.protocol import render_foreign
    from pubsubclub.frontends.stream import protocol as stream
    from pubsubclub.frontends.sysv import codec as sysv_codec
    from pubsubclub.frontends.tep import codec as tep_codec

    payload = {"args": [b"\x01\x02"], "kwargs": {"k": [b""]}}
    text = b'{"args":["\\u0000AQI="],"kwargs":{"k":["\\u0000"]}}'
    assert tep_codec.encode_server(tep_codec.Event("c", payload)) == (b'{"topic":"c","payload":%s}' % text,)
    assert sysv_codec.delivery_text(payload) == text
    assert stream.from_hub_payload(payload) == text
    assert stream.from_hub_payload(b"\x01\x02") == b"\x01\x02"  # a lone bytes payload as itself
    message = render_foreign(payload, "n1", 5, nsd_codec.NSDLimits())
    assert message["body"] == text.decode()
    assert message["payload"] == {"args": ["\x00AQI="], "kwargs": {"k": ["\x00"]}}
    assert render_foreign(b"\x01\x02", "n1", 5, nsd_codec.NSDLimits())["body"] == "\x00AQI="
