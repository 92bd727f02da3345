"""A process whose main thread has exited while another thread runs on (run as a script).

Linux then shows the process's leader as a zombie (state ``Z`` in
``/proc/<pid>/stat``) although the process runs, holds its files and reads
its queue: what a C program that ends ``main`` with ``pthread_exit(NULL)``
looks like. The thread left reads stdin and ends the process at EOF, so the
process ends with the pipe of the test that started it, as ``cat`` does. Its
listening socket (``--listen``: the port is the first line it prints) shows
that the process still holds its files.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

#: The ``Client``/``Popen`` command that runs this script.
COMMAND = (sys.executable, str(Path(__file__).resolve()))


def leader_state(pid: int) -> str:
    """The state ``/proc/<pid>/stat`` shows for the process's leader (its main thread)."""
    from pubsubclub.core.proc import stat_fields  # here: the script itself runs without the package

    return stat_fields(Path(f"/proc/{pid}/stat").read_bytes())[0].decode()


def wait_leaderless(pid: int) -> None:
    """Return once ``pid``'s main thread has exited and ``/proc`` shows its leader as a zombie."""
    from helpers.polling import wait_until

    wait_until(lambda: leader_state(pid) == "Z", f"the main thread of {pid} to exit", timeout=10)


def spawn(*args: str, **popen: Any) -> subprocess.Popen[bytes]:
    """This script as a child (stdin a pipe: closing it ends the child), once its main thread is gone."""
    proc = subprocess.Popen([*COMMAND, *args], stdin=subprocess.PIPE, **popen)
    wait_leaderless(proc.pid)
    return proc


def _serve(listener: socket.socket | None) -> None:
    if listener is not None:
        sys.stdout.write(f"{listener.getsockname()[1]}\n")
        sys.stdout.flush()
    while sys.stdin.buffer.read1(4096):
        pass
    os._exit(0)


def main() -> None:
    """Start the reader thread (with the listener if asked for), then end the main thread."""
    listener = None
    if "--listen" in sys.argv[1:]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
    threading.Thread(target=_serve, args=(listener,), name="reader").start()
    ctypes.CDLL(None).pthread_exit(None)  # the main thread ends here; the reader runs on


if __name__ == "__main__":
    main()
