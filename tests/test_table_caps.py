"""Every table of the WAMP router has a cap that answers, driven message by message on fake transports.

Past each cap the client gets ERROR naming the limit (``kwargs`` ``limit`` and
``max``), the refusal is counted, and nothing of the node changes; what a
session made is gone from every table once it leaves, and the tables shrink.
"""

from __future__ import annotations

import sys
from typing import Any

from autobahn.wamp import message
from autobahn.wamp.role import RoleCalleeFeatures, RoleCallerFeatures, RoleSubscriberFeatures

from pubsubclub.core.compaction import MIN_PEAK, MINIMAL_DICT, Compaction
from pubsubclub.core.hub import Hub, LimitExceeded
from pubsubclub.frontends.wamp import WampLimits, WampRouter
from pubsubclub.testing import MemoryWampTransport


def joined(router: WampRouter, interruptible: bool = False) -> tuple[Any, MemoryWampTransport]:
    """A subscriber, caller and callee session on a fake transport."""
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    roles = {
        "subscriber": RoleSubscriberFeatures(),
        "caller": RoleCallerFeatures(),
        "callee": RoleCalleeFeatures(call_canceling=interruptible),
    }
    session.onMessage(message.Hello("realm1", roles))
    assert isinstance(transport.sent[-1], message.Welcome)
    transport.sent.clear()
    return session, transport


def answer(session: Any, transport: MemoryWampTransport, msg: message.Message) -> Any:
    """Send ``msg`` to the session; the one message it answered."""
    transport.sent.clear()
    session.onMessage(msg)
    (reply,) = transport.sent
    transport.sent.clear()
    return reply


def refused(reply: Any, uri: str, limit: str, value: int) -> None:
    """``reply`` is ERROR ``uri`` naming ``limit`` and its ``value``."""
    assert isinstance(reply, message.Error), reply
    assert reply.error == uri
    assert reply.kwargs == {"limit": limit, "max": value}
    assert f"the limit is {value}" in reply.args[0] or f"limit of {value}" in reply.args[0]


def test_prefix_subscribe_past_the_node_pattern_cap_gets_an_error() -> None:
    """Past the node's pattern cap a prefix SUBSCRIBE gets ERROR too_many_patterns (it was SUBSCRIBED, and then
    nothing came from other nodes); a pattern already held and exact topics still subscribe."""
    hub = Hub(max_patterns=2)
    router = WampRouter(hub)
    first, first_t = joined(router)
    second, second_t = joined(router)
    assert isinstance(answer(first, first_t, message.Subscribe(1, "a.", match="prefix")), message.Subscribed)
    assert isinstance(answer(first, first_t, message.Subscribe(2, "b..c", match="wildcard")), message.Subscribed)
    reply = answer(second, second_t, message.Subscribe(3, "c.", match="prefix"))
    refused(reply, "pubsubclub.error.too_many_patterns", "federation.max-patterns-per-peer", 2)
    assert len(hub.patterns()) == 2
    assert isinstance(answer(second, second_t, message.Subscribe(4, "a.", match="prefix")), message.Subscribed)
    assert isinstance(answer(second, second_t, message.Subscribe(5, "c.x")), message.Subscribed)
    assert hub.metrics.errors[("wamp", "too_many_patterns")] == 1
    first.onClose(True)  # "b..c" goes with its only holder: room again
    assert isinstance(answer(second, second_t, message.Subscribe(6, "c.", match="prefix")), message.Subscribed)


def test_subscribe_past_the_node_topic_cap_gets_an_error() -> None:
    """Past max-subscribed-topics a SUBSCRIBE to a new topic gets ERROR too_many_topics; existing topics still
    subscribe, and the session's other subscriptions are untouched."""
    hub = Hub(max_topics=2)
    router = WampRouter(hub)
    session, transport = joined(router)
    other, other_t = joined(router)
    assert isinstance(answer(session, transport, message.Subscribe(1, "t.one")), message.Subscribed)
    assert isinstance(answer(session, transport, message.Subscribe(2, "t.two")), message.Subscribed)
    refused(
        answer(other, other_t, message.Subscribe(3, "t.three")),
        "pubsubclub.error.too_many_topics",
        "max-subscribed-topics",
        2,
    )
    assert sorted(hub.topics()) == ["t.one", "t.two"]
    assert isinstance(answer(other, other_t, message.Subscribe(4, "t.two")), message.Subscribed)
    assert hub.metrics.errors[("wamp", "too_many_topics")] == 1
    # The node's own subscriptions are not limited (NSD history, the TEP broadcast sink).
    hub.subscribe("$internal", object())  # type: ignore[arg-type]
    assert len(hub.topics()) == 3


def test_hub_refuses_a_limited_subscribe_with_one_exception_and_changes_nothing() -> None:
    """The hub's one refusal for every front-end: LimitExceeded naming the setting; no topic, no interest."""
    hub = Hub(max_topics=1)
    added: list[str] = []

    class Listener:
        def topic_added(self, topic: str) -> None:
            added.append(topic)

        def topic_removed(self, topic: str) -> None:
            pass

    hub.add_interest_listener(Listener())
    sink = object()
    hub.subscribe("one", sink, limited=True)  # type: ignore[arg-type]
    assert not hub.room_for("two") and hub.room_for("one")
    try:
        hub.subscribe("two", sink, limited=True)  # type: ignore[arg-type]
    except LimitExceeded as e:
        assert (e.limit, e.value) == ("max-subscribed-topics", 1)
    else:
        raise AssertionError("no LimitExceeded")
    assert hub.topics() == ["one"] and added == ["one"]


def test_session_subscription_cap_names_its_setting() -> None:
    """The per-session subscription cap answers with its setting's name and value, and is counted."""
    hub = Hub()
    router = WampRouter(hub, limits=WampLimits(max_subscriptions_per_session=1))
    session, transport = joined(router)
    assert isinstance(answer(session, transport, message.Subscribe(1, "t.one")), message.Subscribed)
    reply = answer(session, transport, message.Subscribe(2, "t.two"))
    refused(reply, "pubsubclub.error.too_many_subscriptions", "wamp.max-subscriptions", 1)
    assert hub.metrics.errors[("wamp", "too_many_subscriptions")] == 1


def test_registrations_are_capped_per_session_and_per_node() -> None:
    """One REGISTER past the session's cap, or the node's, gets ERROR too_many_registrations naming which."""
    hub = Hub()
    router = WampRouter(hub, limits=WampLimits(max_registrations_per_session=2, max_registrations=3))
    first, first_t = joined(router)
    second, second_t = joined(router)
    for n in (1, 2):
        assert isinstance(answer(first, first_t, message.Register(n, f"com.a.p{n}")), message.Registered)
    refused(
        answer(first, first_t, message.Register(3, "com.a.p3")),
        "pubsubclub.error.too_many_registrations",
        "wamp.max-registrations",
        2,
    )
    assert isinstance(answer(second, second_t, message.Register(4, "com.b.p1")), message.Registered)
    refused(
        answer(second, second_t, message.Register(5, "com.b.p2")),
        "pubsubclub.error.too_many_registrations",
        "wamp.max-registrations-per-node",
        3,
    )
    assert router.dealer.registrations() == 3
    assert hub.metrics.errors[("wamp", "too_many_registrations")] == 2
    first.onClose(True)  # its two registrations go: the node has room again
    assert isinstance(answer(second, second_t, message.Register(6, "com.b.p2")), message.Registered)


def test_calls_in_flight_are_capped_per_node() -> None:
    """Past the node's calls in flight (all callers together) one more CALL gets ERROR too_many_calls at once,
    naming wamp.max-calls-per-node; an answer frees a place."""
    hub = Hub()
    router = WampRouter(hub, limits=WampLimits(max_calls=2), max_pending_calls=5)
    callee, callee_t = joined(router)
    answer(callee, callee_t, message.Register(1, "com.hold"))
    callers = [joined(router) for _ in range(3)]
    for request, (caller, caller_t) in enumerate(callers[:2], 1):
        caller.onMessage(message.Call(request, "com.hold"))
        assert caller_t.sent == []
    invocations = [m for m in callee_t.sent if isinstance(m, message.Invocation)]
    assert len(invocations) == 2
    caller, caller_t = callers[2]
    refused(
        answer(caller, caller_t, message.Call(9, "com.hold")),
        "pubsubclub.error.too_many_calls",
        "wamp.max-calls-per-node",
        2,
    )
    assert hub.metrics.errors[("wamp", "too_many_calls")] == 1
    callee.onMessage(message.Yield(invocations[0].request, args=["done"]))
    callee_t.sent.clear()
    caller.onMessage(message.Call(10, "com.hold"))
    assert caller_t.sent == [] and isinstance(callee_t.sent[-1], message.Invocation)


def test_an_invocation_over_the_size_limit_is_not_sent_and_the_caller_gets_an_error() -> None:
    """A CALL that fits but whose INVOCATION would not: the callee gets nothing, the caller ERROR
    payload_size_exceeded; both sessions stay, nothing is left in flight, and a small CALL still works."""
    hub = Hub()
    limit = 2048
    router = WampRouter(hub, limits=WampLimits(max_message_size=limit))
    callee, callee_t = joined(router)
    answer(callee, callee_t, message.Register(1, "c"))
    caller, caller_t = joined(router)
    big = "x" * (limit - 30)  # the CALL is under the limit, its INVOCATION (two long ids) over it
    assert len(caller_t.serializer.serialize(message.Call(1, "c", args=[big]))[0]) <= limit
    reply = answer(caller, caller_t, message.Call(1, "c", args=[big]))
    refused(reply, "wamp.error.payload_size_exceeded", "max-message-size", limit)
    assert callee_t.sent == [] and callee_t.open and caller_t.open
    assert router.dealer.calls_in_flight() == 0
    assert hub.metrics.errors[("wamp", "payload_size_exceeded")] == 1
    caller.onMessage(message.Call(2, "c", args=["small"]))
    assert isinstance(callee_t.sent[-1], message.Invocation)


def test_a_result_over_the_callers_limit_becomes_an_error_and_the_session_stays() -> None:
    """A RESULT too big for the caller (a RawSocket client that takes less) is not sent: the caller gets ERROR
    payload_size_exceeded and stays; a progressive one also interrupts the callee's call."""
    hub = Hub()
    router = WampRouter(hub)
    callee, callee_t = joined(router, interruptible=True)
    answer(callee, callee_t, message.Register(1, "com.big"))
    caller, caller_t = joined(router)
    caller_t.max_send_size = 512  # type: ignore[attr-defined]  # as a RawSocket client's handshake says
    for progress in (False, True):
        caller.onMessage(message.Call(7, "com.big", receive_progress=progress))
        invocation = callee_t.sent.pop()
        reply = answer(callee, caller_t, message.Yield(invocation.request, args=["y" * 600], progress=progress))
        refused(reply, "wamp.error.payload_size_exceeded", "max-message-size", 512)
        assert caller_t.open and router.dealer.calls_in_flight() == 0
        if progress:
            assert isinstance(callee_t.sent[-1], message.Interrupt)
    callee.onMessage(message.Yield(invocation.request, args=["late"]))  # the call is over: dropped
    assert caller_t.sent == []


def test_tables_are_empty_and_shrink_once_the_sessions_have_left() -> None:
    """30,000 registrations, calls and subscriptions from 60 sessions: once they leave, every table of the dealer,
    the router and the hub is empty and no bigger than a fresh one (CPython never shrinks a dict by itself)."""
    hub = Hub()
    router = WampRouter(hub, limits=WampLimits(max_registrations=50_000))
    fresh = sys.getsizeof({})
    sessions = [joined(router) for _ in range(60)]
    for i, (session, transport) in enumerate(sessions):
        for n in range(500):
            session.onMessage(message.Register(n + 1, f"com.s{i}.p{n}"))
            session.onMessage(message.Subscribe(n + 1, f"t.s{i}.{n}"))
        transport.sent.clear()
    caller, caller_t = sessions[0]
    for n in range(900):
        caller.onMessage(message.Call(10_000 + n, f"com.s1.p{n % 500}"))
    dealer = router.dealer
    assert dealer.registrations() == 30_000 and dealer.calls_in_flight() == 900 and len(hub.topics()) == 30_000
    for session, _ in sessions:
        session.onClose(False)
    assert set(dealer.tables().values()) == {0}
    assert hub.topics() == [] and router._subscriptions == {}
    tables = [dealer._by_id, dealer._by_procedure, dealer._calls, dealer._by_request, hub._sinks, router._subscriptions]
    assert [sys.getsizeof(t) for t in tables] == [fresh] * len(tables)


def test_compaction_asks_for_a_copy_once_a_large_table_has_fallen_to_a_quarter() -> None:
    """A small table is copied only once it has emptied; a large one at a quarter of its peak, then the mark
    restarts."""
    small = Compaction()
    small.grown(MIN_PEAK - 1)
    assert not small.due(1)
    assert small.due(0) and not small.due(0)
    tiny = Compaction()
    tiny.grown(MINIMAL_DICT)
    assert not tiny.due(0)
    large = Compaction()
    large.grown(4000)
    assert not large.due(1001)
    assert large.due(1000)
    assert large.peak == 1000 and not large.due(999)
