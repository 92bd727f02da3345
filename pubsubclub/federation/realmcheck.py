"""The plain-realm check of the link handshake (sans-IO): nodes that map WAMP realms differently never link.

Every node maps the WAMP topics of its *plain* realm to the plain hub topics
and every other realm's to ``$realm.<realm>#<topic>``
(:mod:`pubsubclub.frontends.wamp.uris`). Two nodes with different plain realms
would deliver one realm's events to another realm's subscribers, so each
tells its plain realm in the WebSocket handshake (``X-PubSubClub-Plain-Realm``,
both directions) and a listener refuses a dialler that names another one
(HTTP 409, the reason naming both). A peer that says nothing (an older node,
or the mixin without a WAMP router) is not checked. docs/protocol.md,
"Realms in the handshake".
"""

from __future__ import annotations

from urllib.parse import quote, unquote

#: HTTP header with the sender's plain WAMP realm, percent-encoded (UTF-8), in both handshake directions.
PLAIN_REALM_HEADER = "x-pubsubclub-plain-realm"
#: Longest header value read (a realm name is at most 255 characters, 4 bytes each, 3 characters per byte).
MAX_REALM_HEADER = 3 * 4 * 255
#: HTTP status of the refusal.
REALM_CONFLICT = 409


def realm_header(realm: str | None) -> dict[str, str]:
    """The handshake header telling ``realm`` (none when it is None)."""
    return {} if realm is None else {PLAIN_REALM_HEADER: quote(realm, safe="")}


def realm_conflict(ours: str | None, said: str | None) -> str | None:
    """Why a peer whose header said ``said`` must not link with a node whose plain realm is ``ours``; None: it may."""
    if ours is None or said is None:
        return None
    theirs = unquote(said[:MAX_REALM_HEADER], errors="replace")
    if theirs == ours:
        return None
    return (
        f"plain realm conflict: this node's plain WAMP realm is {ours!r:.80}, the dialler's {theirs!r:.80};"
        " set [wamp] plain-realm to the same realm on every node"
    )
