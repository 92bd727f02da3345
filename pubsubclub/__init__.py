"""pubsubclub: turn WAMP pub/sub servers into a cluster."""

from pubsubclub.core.hub import Envelope, Hub

__all__ = ["Envelope", "Hub", "__version__"]

__version__ = "0.2.0"
