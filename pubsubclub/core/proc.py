"""Whether a process has ended, read from ``/proc`` (Linux).

``/proc/<pid>/stat`` describes the process's thread-group leader, its main
thread. When the main thread exits while other threads run on (a C program
that ends ``main`` with ``pthread_exit(NULL)``, or a Python one whose main
thread was ended that way), the leader shows state ``Z`` as a zombie does,
yet the process runs: it keeps its files, its listening sockets, and reads
its SysV queue. It has ended only when every task under
``/proc/<pid>/task`` is ``Z`` (zombie) or ``X`` (dead).
"""

from __future__ import annotations

import os

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
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                state = stat_fields(f.read())[:1]
        except OSError:  # that thread is gone meanwhile
            continue
        if state and state[0] not in ENDED_STATES:
            return True
    return False
