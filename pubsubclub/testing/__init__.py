"""Test doubles for pubsubclub's tests and for its users' tests of their own servers.

Like ``treq.testing``, these are fakes, not mocks: each behaves like the real
thing, in memory, on a clock the test moves.

PSC links between nodes (``Federation`` objects), with the real Autobahn
protocols over in-memory transports:

- :class:`MemoryNetwork`: nodes on one ``MemoryReactorClock``; ``node()``,
  ``answer()`` (join every new dial to its listener), ``flush()``,
  ``advance(seconds)``, ``stop()``.
- :class:`MemoryLink`: one answered connection, both protocols and both wires.
- :class:`RecordingWire`: a transport keeping what it wrote (``frames()``,
  ``messages()``, ``close()``), which can be ``muted``.
- :func:`partition` / :class:`Cut`: a link that silently drops everything
  until ``heal()``.
- :class:`RecordingSink`: a hub sink that keeps what it was given.
- :func:`psc_url`: the PSC URL of a node's port.
- :func:`no_logged_errors`: a context that fails if anything logged an error.

Front-end sessions, driven message by message:

- :class:`MemoryWampTransport`: a ``WampTransport`` for a ``BrokerSession``.
- :class:`MemoryTEPTransport`: a ``TEPTransport`` for a ``TEPClient``.

Consul discovery:

- :class:`ConsulDouble`: a Consul agent's HTTP API (as far as discovery uses
  it) over real HTTP; run it as a process with
  ``python -m pubsubclub.testing.consul_agent``.
- :class:`MemoryConsul`: the same double in memory on a ``task.Clock``.

A real Crossbar.io router, for ``pubsubclub bridge`` tests (not imported
here: ``pubsubclub.testing.crossbar``): :class:`~pubsubclub.testing.crossbar.CrossbarProcess`
starts one from a generated ``config.json``; ``make crossbar`` installs it.

The examples to follow are ``tests/test_links_memory.py`` and
``tests/test_replay.py`` (links), ``tests/test_frontend_auth_memory.py``
(sessions) and ``tests/test_discovery.py`` (Consul, deterministic).
"""

from pubsubclub.testing._consul import ConsulDouble, MemoryConsul, RecordedRequest
from pubsubclub.testing._links import (
    Cut,
    MemoryLink,
    MemoryNetwork,
    RecordingSink,
    RecordingWire,
    partition,
    psc_url,
)
from pubsubclub.testing._logs import no_logged_errors
from pubsubclub.testing._transports import MemoryTEPTransport, MemoryWampTransport

__all__ = [
    "ConsulDouble",
    "Cut",
    "MemoryConsul",
    "MemoryLink",
    "MemoryNetwork",
    "MemoryTEPTransport",
    "MemoryWampTransport",
    "RecordedRequest",
    "RecordingSink",
    "RecordingWire",
    "no_logged_errors",
    "partition",
    "psc_url",
]
