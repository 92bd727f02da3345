"""RouterInterest: which topics and patterns a router's non-bridge sessions want, from meta-API facts (sans-IO)."""

from __future__ import annotations

from pubsubclub.frontends.bridge import InterestStep, RouterInterest

ROLE = "pubsubclub-bridge"
OWN = 1


def sub(sub_id: int, uri: str, match: str = "exact") -> dict[str, object]:
    """A subscription as ``wamp.subscription.get`` and ``on_create`` describe it."""
    return {"id": sub_id, "uri": uri, "match": match, "created": "2026-11-25T00:00:00Z"}


def test_a_subscriber_counts_once_its_role_is_known_and_not_the_bridge_role() -> None:
    """Interest waits for wamp.session.get; a client role makes the topic wanted, its departure unwanted."""
    interest = RouterInterest(OWN, ROLE)
    step = interest.created(10, sub(100, "app.t"))
    assert step == InterestStep(lookup=(10,))
    assert interest.role_known(10, "app") == InterestStep(added=(("exact", "app.t"),))
    assert interest.wanted() == {("exact", "app.t")}
    assert interest.unsubscribed(10, 100) == InterestStep(removed=(("exact", "app.t"),))
    assert interest.deleted(100) == InterestStep()
    assert interest.wanted() == set() and interest.sessions() == 0


def test_bridges_and_the_bridge_itself_never_count() -> None:
    """Two bridges on one router cannot keep a topic wanted for each other; our own session is never asked about."""
    interest = RouterInterest(OWN, ROLE)
    assert interest.created(OWN, sub(100, "app.t")) == InterestStep()
    assert interest.subscribed(20, 100) == InterestStep(lookup=(20,))
    assert interest.role_known(20, ROLE) == InterestStep()
    assert interest.wanted() == set()
    assert interest.subscribed(30, 100).lookup == (30,)
    assert interest.role_known(30, "anonymous").added == (("exact", "app.t"),)
    # The other bridge leaving changes nothing; the client leaving ends the interest.
    assert interest.unsubscribed(20, 100) == InterestStep()
    assert interest.unsubscribed(30, 100).removed == (("exact", "app.t"),)


def test_a_listing_replaces_members_and_asks_about_new_sessions_once() -> None:
    """list_subscribers answers are the truth at their arrival; each session's role is asked once."""
    interest = RouterInterest(OWN, ROLE)
    assert interest.listed(sub(100, "app.t"), [10, 11]) == InterestStep(lookup=(10, 11))
    assert interest.listed(sub(101, "app.u"), [10]) == InterestStep()
    step = interest.role_known(10, "app")
    assert set(step.added) == {("exact", "app.t"), ("exact", "app.u")}
    assert interest.listed(sub(100, "app.t"), [11]).removed == (("exact", "app.t"),)
    assert interest.role_known(11, "app").added == (("exact", "app.t"),)


def test_a_session_gone_before_its_role_was_known_never_counts() -> None:
    """wamp.session.get says no such session: it is dropped from every subscription."""
    interest = RouterInterest(OWN, ROLE)
    interest.created(10, sub(100, "app.t"))
    assert interest.role_known(10, None) == InterestStep()
    assert interest.wanted() == set()
    # A late on_subscribe for a subscription never heard of is ignored (its listing is on the way).
    assert interest.subscribed(10, 999) == InterestStep()


def test_patterns_are_interest_too_but_meta_topics_are_not() -> None:
    """Prefix and wildcard subscriptions count with their match; the router's wamp.* topics never do."""
    interest = RouterInterest(OWN, ROLE)
    interest.created(10, sub(100, "app.", "prefix"))
    interest.created(10, sub(101, "app..temp", "wildcard"))
    interest.created(10, sub(102, "wamp.session.on_join"))
    step = interest.role_known(10, "app")
    assert set(step.added) == {("prefix", "app."), ("wildcard", "app..temp")}
    assert interest.subscriptions() == [
        ["exact", "wamp.session.on_join", 1],
        ["prefix", "app.", 1],
        ["wildcard", "app..temp", 1],
    ]
