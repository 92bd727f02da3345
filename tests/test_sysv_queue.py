"""The real queue under the front-end: probes, purges, oversized messages and the receiving thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_twisted
import sysv_ipc
from helpers.polling import until
from helpers.sysvclient import random_key, remove_queue
from twisted.internet import reactor

from pubsubclub.frontends.sysv.codec import BODY_SIZE, Signal, pack
from pubsubclub.frontends.sysv.service import QueueReceiver, SysVQueue


@pytest.fixture
def queue() -> Iterator[SysVQueue]:
    """A queue of a random key, removed at the end."""
    q = SysVQueue(random_key())
    yield q
    remove_queue(q.key)


def test_a_missing_queue_is_created_and_an_existing_one_used(queue: SysVQueue) -> None:
    """The first open creates (mode 0600); a second open finds the same queue."""
    assert queue.created
    again = SysVQueue(queue.key)
    assert not again.created and again.id == queue.id
    assert sysv_ipc.MessageQueue(queue.key).mode & 0o777 == 0o600


def test_waiting_asks_without_taking(queue: SysVQueue) -> None:
    """The zero-room probe says whether a PID has messages, and leaves them where they are."""
    assert not queue.waiting(4242)
    queue.send(4242, pack(1, Signal.OPERATION_SUCCESS))
    queue.send(4243, pack(1, Signal.OPERATION_SUCCESS))
    assert queue.waiting(4242) and queue.waiting(4242)
    assert queue.used() == 2
    assert queue.purge(4242) == 1
    assert not queue.waiting(4242) and queue.waiting(4243)
    assert queue.used() == 1
    assert queue.capacity() == queue.size_bytes() // BODY_SIZE


def test_addressees_lists_every_receiver_and_takes_nothing(queue: SysVQueue) -> None:
    """msgrcv(MSG_COPY) names the mtype of each message, of any size, and leaves them all on the queue."""
    assert queue.addressees() == set()
    raw = sysv_ipc.MessageQueue(queue.key, max_message_size=8192)
    raw.send(b"x" * 3000, type=4243)
    for pid in (1, 4242, 4242, 99999999):
        queue.send(pid, pack(1, Signal.OPERATION_SUCCESS))
    assert queue.addressees() == {1, 4242, 4243, 99999999}
    assert queue.used() == 5
    assert queue.purge(4242) == 2 and queue.addressees() == {1, 4243, 99999999}


def test_an_oversized_message_does_not_block_the_ones_behind_it(queue: SysVQueue) -> None:
    """A message far bigger than the protocol's is read (to be refused), not left at the head."""
    raw = sysv_ipc.MessageQueue(queue.key, max_message_size=8192)
    raw.send(b"x" * 8000, type=1)
    raw.send(pack(4242, Signal.CONNECTION), type=1)
    assert len(queue.receive()) == 8000
    assert queue.receive() == pack(4242, Signal.CONNECTION)


@pytest_twisted.ensureDeferred
async def test_the_receiving_thread_hands_over_and_stops(queue: SysVQueue) -> None:
    """Messages reach the reactor in order; stop wakes the thread, which exits within milliseconds."""
    got: list[bytes] = []
    receiver = QueueReceiver(queue, got.append, reactor, lambda failure: got.append(b"lost"))
    receiver.start()
    for i in range(300):  # more than may be pending at once
        sysv_ipc.MessageQueue(queue.key).send(pack(4242 + i, Signal.CONNECTION), type=1)
    await until(lambda: len(got) == 300, "every message handed over")
    assert got == [pack(4242 + i, Signal.CONNECTION) for i in range(300)]
    await receiver.stop()
    assert not receiver.running
    assert receiver.stop_ms is not None and receiver.stop_ms < 1000
    assert queue.used() == 0


@pytest_twisted.ensureDeferred
async def test_a_removed_queue_is_reported(queue: SysVQueue) -> None:
    """ipcrm under the thread: it ends and reports the loss (the front-end makes a new queue)."""
    lost: list[Exception] = []
    receiver = QueueReceiver(queue, lambda data: None, reactor, lost.append)
    receiver.start()
    queue.remove()
    await until(lambda: bool(lost), "the loss reported")
    assert not receiver.running
