"""Which cluster realm a bridged router's realm is (sans-IO): router topics <-> hub topics.

A bridge joins one realm of its router (``[wamp] realm``) and carries it onto
one realm of the cluster (``[bridge] cluster-realm``, by default the plain
realm), through the cluster's one mapping (:mod:`pubsubclub.frontends.wamp.uris`):
router topic ``t`` is hub topic ``t`` when the cluster realm is the plain one,
else ``$realm.<cluster realm>#t``. Hub topics of other realms, the cluster's
reserved ``$`` topics and the router's own ``wamp.*`` topics never cross.
"""

from __future__ import annotations

from pubsubclub.core.patterns import Pattern
from pubsubclub.frontends.wamp.uris import hub_pattern, hub_topic, split_hub_topic

__all__ = ["RealmMap"]


def _routable(topic: str) -> bool:
    """Whether a router topic may cross (not a reserved ``$`` topic, not the router's ``wamp.*``)."""
    return not topic.startswith("$") and not topic.startswith("wamp.")


class RealmMap:
    """The bridge's realm mapping: its cluster realm and the cluster's plain realm."""

    def __init__(self, cluster_realm: str, plain_realm: str) -> None:
        self.cluster_realm = cluster_realm
        self.plain_realm = plain_realm
        self._plain = cluster_realm == plain_realm

    def to_hub(self, topic: str) -> str | None:
        """The hub topic of router ``topic``; None when it must not cross."""
        if not _routable(topic):
            return None
        return topic if self._plain else hub_topic(self.cluster_realm, topic, self.plain_realm)

    def to_hub_pattern(self, match: str, uri: str) -> Pattern | None:
        """The hub pattern of a router pattern subscription; None when it must not cross."""
        if not _routable(uri):
            return None
        return hub_pattern(self.cluster_realm, match, uri, self.plain_realm)

    def from_hub(self, topic: str) -> str | None:
        """The router topic of hub ``topic`` (a topic or a pattern's text); None: another realm's, or reserved."""
        if self._plain:
            return topic if _routable(topic) else None
        found = split_hub_topic(topic, self.plain_realm)
        if found is None or found[0] != self.cluster_realm or not _routable(found[1]):
            return None
        return found[1]
