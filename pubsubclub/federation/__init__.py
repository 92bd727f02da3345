"""Federation: PubSubClub links between nodes."""

from pubsubclub.federation.federation import Federation
from pubsubclub.federation.session import LinkError, LinkSession, LinkState, Role
from pubsubclub.federation.settings import FederationSettings

__all__ = ["Federation", "FederationSettings", "LinkError", "LinkSession", "LinkState", "Role"]
