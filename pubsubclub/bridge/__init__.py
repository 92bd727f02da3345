"""``pubsubclub bridge``: an unmodified WAMP router as a cluster member (docs/bridge.md).

- :mod:`pubsubclub.bridge.interest`: the router's clients' interest from its meta API (sans-IO).
- :mod:`pubsubclub.bridge.router`: :class:`RouterBridge`, the bridge node's one front-end.
"""

from pubsubclub.bridge.interest import EXACT, Interest, InterestStep, RouterInterest
from pubsubclub.bridge.router import RouterBridge

__all__ = ["EXACT", "Interest", "InterestStep", "RouterBridge", "RouterInterest"]
