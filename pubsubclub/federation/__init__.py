"""Federation: PubSubClub links between nodes."""

from pubsubclub.federation.federation import Federation
from pubsubclub.federation.session import LinkError, LinkSession, LinkState, Role

__all__ = ["Federation", "LinkError", "LinkSession", "LinkState", "Role"]
