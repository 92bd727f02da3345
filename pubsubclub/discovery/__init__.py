"""Discovery: where the servers a node links to come from.

Static discovery is the ``peer`` list in the configuration (``Node.start``
hands it to ``Federation.add_server``). Consul discovery is
:class:`pubsubclub.discovery.consul.ConsulDiscovery`; it drives the same two
calls, ``add_server`` and ``remove_server``, and nothing else.
"""

from pubsubclub.discovery.consul import ConsulDiscovery, TreqHTTPClient, TwistedConsul

__all__ = ["ConsulDiscovery", "TreqHTTPClient", "TwistedConsul"]
