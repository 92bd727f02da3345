"""A message near the size limit, then small ones at once: what a node answers and what the other node delivers."""

from __future__ import annotations

from typing import Any

from autobahn.exception import PayloadExceededError
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions
from twisted.internet import defer

from helpers.nodes import Cluster, interest_reached
from helpers.wampclient import connect, leave, subscribe

#: Small messages sent right after the big one; every one must arrive.
FOLLOWERS = 20


ACK = PublishOptions(acknowledge=True)


async def publish_big_then_followers(
    cluster: Cluster, topic: str, serializer: str, big: str
) -> tuple[Exception | None, list[Any]]:
    """Publish ``big`` on node A, then the followers at once; A's answer to the big one, and what B's subscriber got."""
    a, b = cluster[0], cluster[1]
    sub = await connect(b.wamp_url)
    rec, _ = await subscribe(sub, topic)
    await interest_reached(a, b, topic)
    pub = await connect(a.wamp_url, serializer=serializer)
    first = pub.publish(topic, big, options=ACK)
    rest = [pub.publish(topic, i, options=ACK) for i in range(FOLLOWERS)]
    refused: Exception | None = None
    try:
        await first
    except (ApplicationError, PayloadExceededError) as e:  # Autobahn raises the latter for its error URI
        refused = e
    await defer.gatherResults(rest)
    await rec.wait_until(lambda r: FOLLOWERS - 1 in r.args)
    got = rec.args
    await leave(pub, sub)
    return refused, got
