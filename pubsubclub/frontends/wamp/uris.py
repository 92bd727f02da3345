"""WAMP URIs, realms and ids for the broker (sans-IO).

What a URI may be (the spec's loose rule, and the pattern rules of
pattern-based subscriptions), how a realm's WAMP topic maps to a hub topic
(:func:`hub_topic`, the one place that does it), and the random WAMP ids
every session, subscription and publication gets.

Realms and topics
    The router serves a fixed list of realms. One realm of the cluster, the
    *plain* realm (``[wamp] plain-realm``, by default the first realm served;
    the same on every node), maps WAMP topic ``t`` to hub topic ``t``: the
    topic space NSD, TEP, stream and SysV clients share. Every other realm
    ``r`` maps it to hub topic ``f"$realm.{r}#{t}"``, whichever node serves it
    and whatever else that node serves, so a realm's topics are the same hub
    topics on every node and never meet another realm's. Topics starting with
    ``$`` are reserved for the cluster's own use (no front-end accepts them
    from clients), so the mapping never collides. These functions are the one
    place the mapping is made: tables keyed by hub topic (retained events,
    the meta API) call :func:`hub_topic` and :func:`split_hub_topic`.

Session ids are unique across the cluster without any coordination: each is
drawn uniformly from the spec's whole range 1..2**53 (53 random bits). Among a
million live sessions the chance that any two share an id is about 1 in
18,000 (n**2 / 2**54); the publish options ``eligible`` and ``exclude``, which
name sessions of any node, rely on it (docs/architecture.md).
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from functools import partial
from itertools import repeat
from operator import add

from pubsubclub.core.hub import GAP_TOPIC
from pubsubclub.core.patterns import PREFIX, Pattern

__all__ = [
    "GAP_EVENT_TOPIC",
    "MAX_ID",
    "META_TOPICS",
    "URI_CACHE_SIZE",
    "UriCheck",
    "hub_pattern",
    "hub_prefix",
    "hub_topic",
    "realm_scope",
    "split_hub_topic",
    "pattern_problem",
    "random_wamp_id",
    "uri_problem",
    "wamp_topic",
]

#: Largest WAMP id (the spec's 2**53); ids are drawn from 1..MAX_ID.
MAX_ID = 2**53
#: The router's meta event for lost cross-node messages (docs/protocol.md, "Gap reports").
GAP_EVENT_TOPIC = "wamp.pubsubclub.gap"

#: WAMP meta topics the router publishes itself -> their reserved hub topics (the same in every realm).
#: Clients may subscribe to them; publishing to ``wamp.*`` is refused, so they cannot be forged.
META_TOPICS = {GAP_EVENT_TOPIC: GAP_TOPIC}

#: Strict WAMP URI (spec: "URIs"): lower-case letters, digits and ``_`` in
#: non-empty dot-separated components.
# The WAMP spec's loose URI rule: dot-separated non-empty components without
# whitespace, '.' or '#'. Loose, not strict, because the topic space is shared
# with NSD channels and TEP channels, whose names are not lower-case URIs.
_LOOSE_URI = re.compile(r"^([^\s\.#]+\.)*[^\s\.#]+$")
#: Pattern URIs (WAMP spec, "Pattern-based Subscriptions"): a prefix may end
#: with '.', a wildcard may have empty components anywhere.
_PATTERN_URI = {
    "prefix": re.compile(r"^([^\s\.#]+\.)*[^\s\.#]*$"),
    "wildcard": re.compile(r"^(([^\s\.#]+\.)|\.)*[^\s\.#]*$"),
}



def realm_scope(realm: str) -> str:
    """What the hub topics of a realm other than the plain one start with: ``$realm.<realm>#``."""
    return f"$realm.{realm}#"


def hub_topic(realm: str, topic: str, plain_realm: str) -> str:
    """The hub topic for WAMP ``topic`` in ``realm`` (see module docstring)."""
    meta = META_TOPICS.get(topic)
    if meta is not None:
        return meta
    if realm == plain_realm:
        return topic
    return f"$realm.{realm}#{topic}"


def hub_pattern(realm: str, match: str, uri: str, plain_realm: str) -> Pattern:
    """The hub pattern for WAMP pattern ``uri`` in ``realm``: mapped like a topic, so it stays in its realm."""
    return Pattern(match, uri if realm == plain_realm else f"$realm.{realm}#{uri}")


def hub_prefix(realm: str, prefix: str, plain_realm: str) -> str:
    """The hub-topic prefix for a WAMP topic prefix of ``realm`` (an ``--auth`` role's): it stays in its realm."""
    return prefix if realm == plain_realm else f"$realm.{realm}#{prefix}"


def wamp_topic(realm: str, topic: str, plain_realm: str) -> str:
    """The WAMP topic a client of ``realm`` knows for hub ``topic`` (the inverse of :func:`hub_topic`)."""
    if realm == plain_realm:
        return topic
    return topic.removeprefix(f"$realm.{realm}#")


def split_hub_topic(topic: str, plain_realm: str) -> tuple[str, str] | None:
    """The (realm, WAMP topic) of hub ``topic``; None for the cluster's other reserved ``$`` topics.

    A topic without ``$`` is the plain realm's (and NSD's, TEP's... under
    their prefixes); the inverse of :func:`hub_topic` for every realm at once.
    """
    if not topic.startswith("$"):
        return plain_realm, topic
    if not topic.startswith("$realm."):
        return None
    realm, sep, rest = topic[7:].partition("#")
    if not sep or not realm:
        return None
    return realm, rest


def pattern_problem(match: str, uri: str, max_length: int) -> str | None:
    """Why ``uri`` is not an acceptable prefix or wildcard pattern, or None if it is."""
    if len(uri) > max_length:
        return f"URI is {len(uri)} characters long; the limit is {max_length}"
    if not uri:
        return f"an empty {match} pattern is not allowed (it would match every topic)"
    if uri.startswith("$"):
        return f"URI {uri!r:.80} is reserved: topics starting with '$' are the cluster's own"
    if not uri.isascii() and any(0xD800 <= ord(c) <= 0xDFFF for c in uri):
        return f"URI {uri!r:.80} holds a lone surrogate, which is not valid Unicode text"
    if not _PATTERN_URI[match].fullmatch(uri):
        shape = "components" if match == PREFIX else "components or empty ones"
        return f"URI {uri!r:.80} is not a WAMP {match} pattern (dot-separated non-empty {shape}, no whitespace or '#')"
    return None


def uri_problem(uri: str, max_length: int) -> str | None:
    """Why ``uri`` is not an acceptable (loose) WAMP URI, or None if it is."""
    if len(uri) > max_length:
        return f"URI is {len(uri)} characters long; the limit is {max_length}"
    if uri.startswith("$"):
        return f"URI {uri!r:.80} is reserved: topics starting with '$' are the cluster's own"
    if not uri.isascii() and any(0xD800 <= ord(c) <= 0xDFFF for c in uri):
        return f"URI {uri!r:.80} holds a lone surrogate, which is not valid Unicode text"
    if not _LOOSE_URI.fullmatch(uri):
        return f"URI {uri!r:.80} is not a WAMP URI (dot-separated non-empty components without whitespace or '#')"
    return None


#: Good URIs a router remembers (``UriCheck``); past it the oldest is forgotten first.
URI_CACHE_SIZE = 4096


class UriCheck:
    """:func:`uri_problem` for one length limit, with the URIs found good remembered.

    A client publishes on the same few topics over and over; the check
    (length, reserved prefix, surrogates, a regular expression) ran for each
    PUBLISH. Only good URIs are kept, at most ``size`` (oldest first out), and
    nothing else decides the answer, so nothing is ever stale.
    """

    def __init__(self, max_length: int, size: int = URI_CACHE_SIZE) -> None:
        self.max_length = max_length
        self.size = size
        self._good: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._good)

    def __call__(self, uri: str) -> str | None:
        """Why ``uri`` is not an acceptable WAMP URI, or None if it is."""
        good = self._good
        if uri in good:
            return None
        problem = uri_problem(uri, self.max_length)
        if problem is None:
            if len(good) >= self.size:
                del good[next(iter(good))]
            good[uri] = None
        return problem


# Drawn uniformly as the spec asks, from a generator seeded once from the OS:
# SystemRandom would cost a getrandom() syscall per publication. WAMP ids are
# identifiers, not secrets (authentication challenges use os.urandom).
_random = random.Random(os.urandom(32))

#: A random WAMP id in the spec's global range 1..2**53 (uniform: 53 random bits, plus one). Built of
#: C callables (``getrandbits(53) + 1`` per call, drawn by ``next``): one per EVENT and session, no Python frame.
random_wamp_id: Callable[[], int] = partial(next, map(add, iter(partial(_random.getrandbits, 53), None), repeat(1)))
