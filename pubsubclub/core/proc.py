"""Whether a process has ended, read from ``/proc`` (Linux).

``/proc/<pid>/stat`` describes the process's thread-group leader, its main
thread. When the main thread exits while other threads run on (a C program
that ends ``main`` with ``pthread_exit(NULL)``, or a Python one whose main
thread was ended that way), the leader shows state ``Z`` as a zombie does,
yet the process runs: it keeps its files, its listening sockets, and reads
its SysV queue. It has ended only when no thread but the leader is left:
``/proc/<pid>/status`` counts the threads not yet released (``Threads:``),
the zombie leader included, so a leader in ``Z`` with ``Threads`` above 1
still has a thread running or still exiting (and holding the files). One
read, whatever the number of threads: a client cannot make the check cost
more by starting many (listing ``/proc/<pid>/task`` of 200 threads cost a
SysV request about 85 us more).
"""

from __future__ import annotations

#: States of a task that has exited (``man 5 proc``, ``/proc/pid/stat`` field 3).
ENDED_STATES = (b"Z", b"X")


def stat_fields(stat: bytes) -> list[bytes]:
    """The fields of a ``/proc/<pid>/stat`` line after the command name: ``[state, ppid, pgrp, ...]``.

    The command name is in parentheses and may itself hold spaces and
    parentheses, so the fields follow the last ``)``.
    """
    return stat[stat.rfind(b")") + 2 :].split()


def any_thread_running(pid: int) -> bool:
    """Whether some thread of process ``pid`` has not exited (False when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return False
    state = b""
    for line in status.splitlines():
        if line.startswith(b"State:"):
            state = line[6:].strip()[:1]
        elif line.startswith(b"Threads:"):  # after State:
            return state not in ENDED_STATES or int(line[8:]) > 1
    return False
