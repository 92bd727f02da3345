"""``pubsubclub bridge``: an unmodified WAMP router as a cluster member (docs/bridge.md).

- :mod:`pubsubclub.frontends.bridge.interest`: the router's clients' interest from its meta API (sans-IO).
- :mod:`pubsubclub.frontends.bridge.router`: :class:`RouterBridge`, the bridge node's one front-end.
"""

from pubsubclub.frontends.bridge.interest import EXACT, Interest, InterestStep, RouterInterest
from pubsubclub.frontends.bridge.router import RouterBridge

__all__ = ["EXACT", "Interest", "InterestStep", "RouterBridge", "RouterInterest"]
