"""The WAMP v2 front-end: a broker-only router on top of the hub."""

from pubsubclub.frontends.wamp.broker import BrokerSession, WampLimits, WampRouter
from pubsubclub.frontends.wamp.transport import wamp_resource, wamp_site

__all__ = ["BrokerSession", "WampLimits", "WampRouter", "wamp_resource", "wamp_site"]
