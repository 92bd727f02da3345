"""Link frame sizes, in memory: a message too big for a link never costs the message after it (issue 18, finding 6).

Real Federations and their Autobahn link protocols over ``iosim`` on one
``MemoryReactorClock`` (``pubsubclub.testing.MemoryNetwork``); the fixture
fails the test if anything logged an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pubsubclub.core.hub import GAP_TOPIC, Hub
from pubsubclub.federation import Federation, psc
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.federation.transport import MAX_FRAME_HEADER, peer_max_frame
from pubsubclub.testing import MemoryNetwork, RecordingSink, no_logged_errors, psc_url

REPLAY = ReplaySettings(max_bytes=1024 * 1024, window=60.0)
#: Frames of at most 4096 + 1024 bytes.
LIMITS = psc.Limits(max_message_size=4096, link_headroom=1024)


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    """An in-memory network; the test fails if anything logged an error."""
    with no_logged_errors():
        yield MemoryNetwork()


def _linked(
    net: MemoryNetwork, consumer_limits: psc.Limits = LIMITS
) -> tuple[Federation, RecordingSink, RecordingSink]:
    """Producer ``b`` (LIMITS) and consumer ``a`` subscribed to ``t`` and to gap reports, linked with 0.5 (batched)."""
    a = net.node("a", 9001, replay=REPLAY, limits=consumer_limits)
    b = net.node("b", 9002, replay=REPLAY, limits=LIMITS)
    sink, gaps = RecordingSink(), RecordingSink()
    a.hub.subscribe("t", sink)
    a.hub.subscribe(GAP_TOPIC, gaps)
    a.add_server(psc_url(9002))
    net.answer()
    assert [r["version"] for r in b.links()] == ["0.8"]
    return b, sink, gaps


def _publish_in_one_turn(hub: Hub, *payloads: Any) -> None:
    """Publish without a front-end's check (as the bridge and the mixin do), all in one reactor turn."""
    for payload in payloads:
        hub.publish(hub.envelope("t", payload))


def test_a_message_over_the_frame_limit_goes_alone_and_the_next_one_arrives(net: MemoryNetwork) -> None:
    """In a turn's batch, a message over the link frame limit is dropped alone and counted; the 20 around it arrive."""
    b, sink, gaps = _linked(net)
    _publish_in_one_turn(b.hub, "before", "x" * (LIMITS.max_link_frame + 1), *range(20))
    net.flush()
    assert [e.payload for e in sink.got] == ["before", *range(20)]
    assert b.stats["dropped_too_large"] == 1
    assert b.open_links() == 1
    # The consumer is told: the dropped message's sequence number was skipped.
    assert [e.payload["lost"] for e in gaps.got] == [1]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_a_message_just_under_the_frame_limit_goes_alone_and_everything_arrives(net: MemoryNetwork) -> None:
    """A message that fills a frame by itself is sent in its own frame, between the batches around it."""
    b, sink, gaps = _linked(net)
    big = "y" * (LIMITS.max_link_frame - 200)
    _publish_in_one_turn(b.hub, "before", big, *range(20))
    net.flush()
    assert [e.payload for e in sink.got] == ["before", big, *range(20)]
    assert b.stats["dropped_too_large"] == 0 and gaps.got == []
    net.stop()


def test_a_peer_with_a_smaller_limit_is_sent_only_what_it_accepts(net: MemoryNetwork) -> None:
    """A consumer whose frame limit is smaller never gets a frame over it (no 1009, no flapping); the rest arrive."""
    small = psc.Limits(max_message_size=2048, link_headroom=1024)
    b, sink, gaps = _linked(net, consumer_limits=small)
    fits_b_only = "z" * (small.max_link_frame + 100)
    _publish_in_one_turn(b.hub, fits_b_only, *range(20))
    net.flush()
    assert [e.payload for e in sink.got] == list(range(20))
    assert b.stats["dropped_too_large"] == 1 and b.stats["links_opened"] == 1
    assert [e.payload["lost"] for e in gaps.got] == [1]
    net.stop()


def test_front_end_check_refuses_what_cannot_fit_and_keeps_the_encoding_for_forwarding(net: MemoryNetwork) -> None:
    """Hub.refusal names the link limit for a PSC301 over it; a fitting large one is encoded once, then forwarded."""
    b, sink, _gaps = _linked(net)
    hub = b.hub
    small = hub.envelope("t", "tiny")
    assert hub.refusal(small, 10) is None
    too_big = hub.envelope("t", "\x01" * 1000)  # 1,000 bytes from a MessagePack client, 6,000 as JSON
    problem = hub.refusal(too_big, 1000)
    assert problem is not None and "over the link limit of 5120 bytes" in problem
    fits = hub.envelope("t", "w" * 1000)
    assert hub.refusal(fits, 1000) is None and fits.wire
    hub.publish(fits)
    net.flush()
    assert [e.payload for e in sink.got] == ["w" * 1000]
    net.stop()


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        (None, 4096),  # an older node: its limit was --max-message-size (the cluster's)
        ("3000", 3000),
        ("999999999", LIMITS.max_link_frame),  # never more than we accept ourselves
        ("10", 1024),
        ("-5", 4096),
        ("1e9", 4096),
        ("9" * 40, 4096),
    ],
)
def test_peer_frame_limit_from_its_handshake(said: str | None, expected: int) -> None:
    """X-PubSubClub-Max-Frame is read as digits, clamped to [1024, our own]; absent means max-message-size."""
    assert MAX_FRAME_HEADER == "x-pubsubclub-max-frame"
    assert peer_max_frame(said, LIMITS) == expected
