"""The real SysV queue (``sysv_ipc``) and its receiving thread.

:class:`SysVQueue`: non-blocking sends, a blocking receive for the receiving
thread, and the probes the budget uses. :class:`QueueReceiver`: the queue has
no file descriptor, so a thread blocks in ``msgrcv(type=1)`` and hands each
message to the reactor with ``callFromThread``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import sysv_ipc
from twisted.internet import defer
from twisted.logger import Logger

from pubsubclub.frontends.sysv.budget import QueueFull, QueueGone
from pubsubclub.frontends.sysv.codec import (
    BODY_SIZE,
    SERVER_ID,
    pack,
)

log = Logger()

#: Messages the receiving thread may hand to the reactor before it waits for them to be handled.
MAX_PENDING = 256


#: Seconds :meth:`QueueReceiver.stop` waits for the thread.
STOP_SECONDS = 2.0


# -- the real queue --------------------------------------------------------------------------


def _kernel_limit(name: str, default: int) -> int:
    """``/proc/sys/kernel/<name>`` as an int (``default`` where there is none)."""
    try:
        with open(f"/proc/sys/kernel/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return default


#: ``msgrcv`` flags that copy the message at an index and leave it: MSG_COPY | IPC_NOWAIT (Linux headers).
_COPY_FLAGS = 0o40000 | 0o4000


_MTYPE = ctypes.c_long


def _message_copier(size: int) -> tuple[Any, Any, int] | None:
    """libc's ``msgrcv`` and a buffer for one message of ``size`` bytes (struct msgbuf: mtype, mtext)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        msgrcv = libc.msgrcv
    except (OSError, AttributeError):
        return None
    msgrcv.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long, ctypes.c_int)
    msgrcv.restype = ctypes.c_ssize_t
    return msgrcv, ctypes.create_string_buffer(ctypes.sizeof(_MTYPE) + size), size


class SysVQueue:
    """The node's queue through ``sysv_ipc``: created if missing (mode 0600), else used as it is."""

    #: Access mode of a queue the node creates: the node's user (and root) only.
    MODE = 0o600
    #: Largest receive buffer the reading handle grows to (a message is at most kernel.msgmax).
    MAX_RECEIVE = 1 << 26

    def __init__(self, key: int) -> None:
        self.key = key
        try:
            self._queue = sysv_ipc.MessageQueue(key, sysv_ipc.IPC_CREX, self.MODE, max_message_size=BODY_SIZE)
            #: True if this node created the queue; False if it was there already.
            self.created = True
        except sysv_ipc.ExistentialError:
            self._queue = sysv_ipc.MessageQueue(key, 0, max_message_size=BODY_SIZE)
            self.created = False
        self.id: int = self._queue.id
        # msgrcv without MSG_NOERROR leaves a message bigger than the buffer on the
        # queue (E2BIG), where it would block every later one: read with room for the largest.
        self._receive_size = max(BODY_SIZE, _kernel_limit("msgmax", 8192))
        self._reader = self._handle(self._receive_size)
        # No room at all: msgrcv fails with E2BIG, taking nothing, when a message waits.
        self._prober = self._handle(0)
        self._copy = _message_copier(self._receive_size)

    def _handle(self, size: int) -> sysv_ipc.MessageQueue:
        return sysv_ipc.MessageQueue(self.key, 0, max_message_size=size)

    def size_bytes(self) -> int:
        """The queue's ``msg_qbytes``."""
        return int(self._queue.max_size)

    def grow(self, wanted: int) -> bool:
        """Raise ``msg_qbytes`` to ``wanted`` (past kernel.msgmnb only with CAP_SYS_RESOURCE); True if it is."""
        if self.size_bytes() >= wanted:
            return True
        for size in (wanted, _kernel_limit("msgmnb", 0)):
            if size <= self.size_bytes():
                continue
            try:
                self._queue.max_size = size
            except (sysv_ipc.Error, OSError):
                continue
        return self.size_bytes() >= wanted

    # -- ClientQueue -----------------------------------------------------------------------

    def send(self, pid: int, data: bytes) -> None:
        """``msgsnd`` with IPC_NOWAIT to ``pid``."""
        try:
            self._queue.send(data, block=False, type=pid)
        except sysv_ipc.BusyError:
            raise QueueFull from None
        except (sysv_ipc.Error, OSError) as e:
            raise QueueGone(str(e)) from None

    def waiting(self, pid: int) -> bool:
        """True if something waits for ``pid`` (taken from nothing: a message that waits does not fit no room)."""
        for _ in range(4):
            try:
                self._prober.receive(block=False, type=pid)
            except OSError as e:
                if e.errno == errno.E2BIG:
                    return True
                raise
            except sysv_ipc.BusyError:
                return False
            except sysv_ipc.ExistentialError:
                return False
            # An empty message for pid was taken (never ours): ask again.
        return True

    def used(self) -> int:
        """Messages on the queue."""
        try:
            return int(self._queue.current_messages)
        except sysv_ipc.ExistentialError:
            return 0

    def capacity(self) -> int:
        """Messages of the protocol's size the queue holds."""
        return self.size_bytes() // BODY_SIZE

    def addressees(self) -> set[int] | None:
        """The ``mtype`` of every message on the queue, copied and left there (``msgrcv`` with ``MSG_COPY``).

        MSG_COPY (Linux 3.8+, ``CONFIG_CHECKPOINT_RESTORE``) reads the message
        at an index without taking it. Without it (ENOSYS) this is None, logged
        once, and strays stay (docs/sysv.md). The queue may change between two
        calls; a message missed now is seen at the next sweep.
        """
        if self._copy is None:
            return None
        copy, buffer, size = self._copy
        found: set[int] = set()
        for index in range(self.used() + 1):
            if copy(self.id, buffer, size, index, _COPY_FLAGS) >= 0:
                found.add(_MTYPE.from_buffer(buffer).value)
                continue
            error = ctypes.get_errno()
            if error == errno.E2BIG:
                continue  # larger than kernel.msgmax was at start: not the protocol's, and not countable here
            if error in (errno.ENOSYS, errno.EPERM) and not found:
                log.warn(
                    "SysV: msgrcv(MSG_COPY) is not available ({e}): messages to stray PIDs are not removed",
                    e=os.strerror(error),
                )
                self._copy = None
                return None
            if error in (errno.EIDRM, errno.EINVAL):
                raise QueueGone(os.strerror(error))
            break  # ENOMSG: past the last message
        return found

    def purge(self, pid: int) -> int:
        """Take every message waiting for ``pid``; how many."""
        taken = 0
        for _ in range(self.capacity() + 64):
            try:
                self._reader.receive(block=False, type=pid)
            except sysv_ipc.BusyError:
                break
            except sysv_ipc.ExistentialError:
                raise QueueGone from None
            taken += 1
        return taken

    # -- the receiving thread ----------------------------------------------------------------

    def receive(self) -> bytes:
        """Wait for the next message to the server (blocking: call it from a thread); QueueGone if removed."""
        while True:
            try:
                data, _ = self._reader.receive(block=True, type=SERVER_ID)
                return bytes(data)
            except sysv_ipc.ExistentialError:
                raise QueueGone(f"queue {self.key:#x} was removed") from None
            except OSError as e:
                if e.errno != errno.E2BIG or self._receive_size >= self.MAX_RECEIVE:
                    raise
                # kernel.msgmax was raised after the start: a bigger message is possible now.
                self._receive_size = min(self.MAX_RECEIVE, max(self._receive_size * 2, _kernel_limit("msgmax", 0)))
                self._reader = self._handle(self._receive_size)
            except sysv_ipc.Error as e:
                if type(e) is not sysv_ipc.Error:
                    raise
                # EINTR: a signal reached this thread; wait again.

    def wake(self) -> bool:
        """Send the server a message no client sends (sender 1), so the receiving thread returns; True if sent."""
        try:
            self._queue.send(pack(SERVER_ID, 0), block=False, type=SERVER_ID)
        except (sysv_ipc.Error, OSError):
            return False
        return True

    def remove(self) -> None:
        """Remove the queue from the system (``ipcrm -q``)."""
        self._queue.remove()


class QueueReceiver:
    """The thread that waits in ``msgrcv(type=1)`` and hands each message to the reactor.

    At most :data:`MAX_PENDING` messages are handed over and not yet handled:
    past that the thread waits, and further requests wait on the queue (where
    the kernel bounds them), not in the reactor's memory.
    """

    def __init__(
        self,
        queue: SysVQueue,
        handle: Callable[[bytes], None],
        reactor: Any,
        lost: Callable[[Exception], None],
    ) -> None:
        self._queue = queue
        self._handle = handle
        self._reactor = reactor
        self._lost = lost
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._done: defer.Deferred[None] = defer.Deferred()
        #: Milliseconds the last :meth:`stop` took, once it is done.
        self.stop_ms: float | None = None

    @property
    def running(self) -> bool:
        """The thread is receiving."""
        return self._thread is not None and not self._done.called

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name=f"sysv-receiver-{self._queue.key:#x}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failure: Exception | None = None
        while not self._stopping:
            self._pending.acquire()
            try:
                data = self._queue.receive()
            except Exception as e:  # QueueGone, or the queue became unusable (permissions)
                self._pending.release()
                failure = e
                break
            if self._stopping:
                self._pending.release()
                break
            self._reactor.callFromThread(self._deliver, data)
        self._reactor.callFromThread(self._exited, failure)

    def _deliver(self, data: bytes) -> None:
        try:
            self._handle(data)
        finally:
            self._pending.release()

    def _exited(self, failure: Exception | None) -> None:
        if not self._done.called:
            self._done.callback(None)
        if failure is not None and not self._stopping:
            self._lost(failure)

    def stop(self) -> defer.Deferred[None]:
        """Stop receiving: wake the thread with a message of its own; fires when it has exited.

        If it cannot be woken (queue full or gone) within :data:`STOP_SECONDS`,
        fires anyway: the thread is a daemon and ends with the process.
        """
        if self._thread is None or self._done.called:
            return defer.succeed(None)
        self._stopping = True
        started = time.perf_counter()
        done: defer.Deferred[None] = defer.Deferred()
        wakes: list[Any] = []

        def wake() -> None:
            if not self._done.called and not self._queue.wake():
                wakes.append(self._reactor.callLater(0.1, wake))  # full: try again soon

        def exited(_: object) -> None:
            self.stop_ms = (time.perf_counter() - started) * 1000
            log.info("SysV receiving thread stopped in {ms:.2f} ms", ms=self.stop_ms)
            finish()

        def give_up() -> None:
            log.warn("SysV receiving thread did not stop within {s} s; left to end with the process", s=STOP_SECONDS)
            finish()

        def finish() -> None:
            for call in (*wakes, timeout):
                if call.active():
                    call.cancel()
            if not done.called:
                done.callback(None)

        timeout = self._reactor.callLater(STOP_SECONDS, give_up)
        self._done.addCallback(exited)
        wake()
        return done
