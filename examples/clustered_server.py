"""The user's own WAMP server (``tiny_wamp_server.py``) joined to a PubSubClub cluster.

The whole integration is the class below: mix in ``PubSubClubMixin``, call
``pubsubclub_setup``, report first/last subscribers and local publishes (with
their WAMP args and kwargs), and implement ``pubsubclub_dispatch_event`` for
messages from other nodes.

    python examples/clustered_server.py --name a --wamp 8081 --psc 9101 --peer ws://127.0.0.1:9102/psc
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from tiny_wamp_server import TinyServer, TinySession  # noqa: E402
from twisted.internet import reactor  # noqa: E402
from twisted.internet.endpoints import serverFromString  # noqa: E402

from pubsubclub.mixin import PubSubClubMixin  # noqa: E402


class ClusteredServer(PubSubClubMixin, TinyServer):
    """TinyServer, federated."""

    def __init__(self, name: str) -> None:
        TinyServer.__init__(self)
        self.pubsubclub_setup(node_id=name)

    def add_subscriber(self, topic: str, session: TinySession) -> int:
        sub_id = super().add_subscriber(topic, session)
        self.pubsubclub_subscribed(topic)  # idempotent: only the first one counts
        return sub_id

    def remove_subscriber(self, topic: str, session: TinySession) -> None:
        super().remove_subscriber(topic, session)
        if topic not in self.subscribers:
            self.pubsubclub_unsubscribed(topic)

    def dispatch(self, topic: str, args: list[Any], kwargs: dict[str, Any], exclude: Any = None) -> None:
        super().dispatch(topic, args, kwargs, exclude)
        self.pubsubclub_published_event(topic, args, kwargs)  # args and kwargs cross unchanged

    def pubsubclub_dispatch_event(self, topic: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        TinyServer.dispatch(self, topic, args, kwargs)  # local only: never forwarded again


def main() -> None:
    """Run one clustered server until Ctrl-C."""
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--wamp", type=int, required=True)
    p.add_argument("--psc", type=int, required=True)
    p.add_argument("--peer", action="append", default=[])
    args = p.parse_args()
    server = ClusteredServer(args.name)
    serverFromString(reactor, f"tcp:{args.wamp}:interface=127.0.0.1").listen(
        server.factory(f"ws://127.0.0.1:{args.wamp}")
    )
    server.pubsubclub_listen(f"tcp:{args.psc}:interface=127.0.0.1")
    for url in args.peer:
        server.add_server(url)
    print('{"event": "ready"}', flush=True)
    reactor.run()


if __name__ == "__main__":
    main()
