"""A System V client in the test process: it speaks for the PID of a ``cat`` child it owns, on a real queue."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Sequence

import sysv_ipc

from pubsubclub.frontends.sysv.codec import BODY_SIZE, MESSAGE_COUNT_BASE, RawMessage, Signal, pack, unpack

#: Bound for one reply or delivery to arrive.
RECEIVE_SECONDS = 5.0


def random_key() -> int:
    """A queue key no queue has (never the spec's 0x420)."""
    while True:
        key = random.randint(0x10000000, 0x7FFFFFF0)
        try:
            sysv_ipc.MessageQueue(key)
        except sysv_ipc.ExistentialError:
            return key


def remove_queue(key: int) -> None:
    """Remove the queue of ``key`` if it is there."""
    try:
        sysv_ipc.MessageQueue(key).remove()
    except sysv_ipc.ExistentialError:
        pass


class Client:
    """A SysV client in this process, speaking for the PID of a ``cat`` child it owns."""

    def __init__(self, key: int, command: Sequence[str] = ("cat",)) -> None:
        # cat ends when this process does (its stdin closes), so no test leaves one behind; another
        # ``command`` must end at EOF on its stdin too.
        self.proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        self.pid = self.proc.pid
        self.queue = sysv_ipc.MessageQueue(key)
        #: Messages that came while waiting for a reply.
        self.inbox: list[RawMessage] = []

    def send(self, type: int, short: bytes = b"", long: bytes = b"") -> None:
        """One message to the server."""
        self.queue.send(pack(self.pid, type, short, long), type=1)

    def poll(self) -> RawMessage | None:
        """The next message for this client, if one is waiting."""
        try:
            data, _ = self.queue.receive(block=False, type=self.pid)
        except sysv_ipc.BusyError:
            return None
        assert len(data) == BODY_SIZE, f"the server sent {len(data)} bytes"
        return unpack(data)

    def next(self, timeout: float = RECEIVE_SECONDS) -> RawMessage:
        """The next message for this client (inbox first)."""
        if self.inbox:
            return self.inbox.pop(0)
        deadline = time.monotonic() + timeout
        while (message := self.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing for {self.pid} within {timeout} s")
            time.sleep(0.001)
        return message

    def ask(self, type: int, short: bytes = b"", long: bytes = b"") -> Signal:
        """Send and wait for the reply; what else arrives meanwhile goes to the inbox."""
        self.send(type, short, long)
        deadline = time.monotonic() + RECEIVE_SECONDS
        while True:
            message = self.poll()
            if message is None:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no reply to {Signal(type).name} for {self.pid}")
                time.sleep(0.001)
                continue
            assert message.sender == 1
            if message.type < MESSAGE_COUNT_BASE and message.type != Signal.NEW_CHANNEL:
                return Signal(message.type)
            self.inbox.append(message)

    def collected(self) -> list[RawMessage]:
        """Move what is waiting into :attr:`inbox` (without waiting) and return the inbox."""
        while (message := self.poll()) is not None:
            self.inbox.append(message)
        return self.inbox

    def texts(self, n: int) -> list[str]:
        """The texts of the next ``n`` deliveries."""
        got = [self.next() for _ in range(n)]
        assert all(m.type >= MESSAGE_COUNT_BASE for m in got), got
        return [m.long_text.split(b"\0")[0].decode() for m in got]

    def nothing_more(self) -> bool:
        """Nothing came for this client before the reply to a marker sent now (the node answers in order).

        The marker is CONNECTION, answered with OPERATION_SUCCESS whether or not the client is
        logged in and changing nothing: whatever an earlier message would have caused had to
        arrive before that reply.
        """
        if self.collected():
            return False
        self.send(Signal.CONNECTION)
        marker = self.next()
        return marker.sender == 1 and marker.type == Signal.OPERATION_SUCCESS and not self.collected()

    def kill(self) -> None:
        """The client process dies (and is reaped)."""
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def close(self) -> None:
        """QUIT and end the process."""
        try:
            self.send(Signal.QUIT)
        except sysv_ipc.Error:
            pass
        self.kill()
