"""Publish times another node claims (PSC301 ``t``) are bounded: none breaks NSD or the metrics.

A raw PSC producer (the ``websockets`` library) links to a real node with
every front-end and sends PSC301 messages whose publish time is absurd; the
node drops them (counted, link kept) and the next message reaches an NSD
client with a sane ``when``. The node's log must hold no traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from helpers.nodes import NodeProcess, assert_clean_log
from helpers.nsdclient import SANE_WHEN, SUCCESS, NSDClient
from helpers.polling import until
from helpers.pscpeer import psc_producer

pytestmark = pytest.mark.slow


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """One node with every front-end, listening as consumer (a raw PSC peer that dials it is a producer)."""
    proc = NodeProcess("n1", tmp_path, listen_role="consumer", frontends=True).start()
    yield proc
    proc.stop()


@pytest_twisted.ensureDeferred
async def test_a_huge_publish_time_is_dropped_without_a_traceback(node: NodeProcess) -> None:
    """PSC301 with t = 1e308, -1.7e308, 1e11 or -1 on an NSD channel is dropped and counted; the next one arrives."""
    reader = NSDClient(node.nsd_port, "Alice")
    assert reader.open() == SUCCESS  # opens channel Alice and subscribes it
    producer = psc_producer(node)
    await until(lambda: node.stats()["federation"]["links_opened"] == 1, "the raw producer's link")
    for i, t in enumerate(("1e308", "-1.7e308", "1e11", "-1")):
        producer.send(f'[301, "Alice", "bad {i}", {{"o": "raw", "t": {t}, "i": "raw-bad-{i}"}}]')
    producer.send('[301, "Alice", "good", {"o": "raw", "t": 1700000000.5, "i": "raw-good"}]')
    await until(lambda: len(reader.get(0)) == 1, "the good message at the NSD client")
    [message] = reader.get(0)
    assert message["body"] == "good" and 0 < message["when"] < SANE_WHEN, message
    federation = node.stats()["federation"]
    assert federation["dropped_bounds"] == 4 and federation["links_opened"] == 1
    producer.close()
    reader.close()
    assert_clean_log(node)
