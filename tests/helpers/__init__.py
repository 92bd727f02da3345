"""What the tests share: node processes, ports, polling, /proc readings, Prometheus parsing and raw clients.

Test modules import from here (``from helpers.nodes import NodeProcess``); ``tests/`` is on
``sys.path`` because pytest puts the folder of the rootdir ``conftest.py`` there, and node
processes the tests start never import these modules. ``conftest.py`` holds fixtures only,
and no test module imports another: what two test files share lives in this package.

- :mod:`helpers.ports`: free TCP ports below the ephemeral range.
- :mod:`helpers.polling`: ``until`` (on the reactor) and ``wait_until`` (blocking), both bounded.
- :mod:`helpers.nodes`: the one node-process launcher (:class:`~helpers.nodes.NodeProcess`), clusters,
  node-log checks.
- :mod:`helpers.procfs`: a process's resident memory and open files, from ``/proc``.
- :mod:`helpers.prometheus`: one sample out of ``/metrics`` text.
- raw clients: :mod:`helpers.rawws`, :mod:`helpers.wampclient`, :mod:`helpers.nsdclient`,
  :mod:`helpers.streamclient`, :mod:`helpers.tepclient`, :mod:`helpers.sysvclient`,
  :mod:`helpers.rawsocketclient`, :mod:`helpers.pscpeer`, :mod:`helpers.hostile` (generated bad input),
  :mod:`helpers.certs`.
- other processes and networks: :mod:`helpers.bridgeproc`, :mod:`helpers.consulproc`, :mod:`helpers.netns`.
- :mod:`helpers.spark`: the report tests' frame comparison and dump writers.
"""
