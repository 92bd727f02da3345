"""Whether a process has ended (``pubsubclub.core.proc``): a main thread gone is not a process gone.

A process whose main thread exited while another runs on shows its leader as a
zombie in ``/proc/<pid>/stat``. The SysV front-end must keep serving it
(``process_start``), and the Crossbar launcher's kill must wait for it, since
it still holds its sockets (``_group_members``).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import pytest
from helpers import leaderless

from pubsubclub.core.proc import any_thread_running, stat_fields
from pubsubclub.frontends.sysv.budget import process_start
from pubsubclub.testing.crossbar import _group_members


@pytest.fixture
def headless() -> Iterator[subprocess.Popen[bytes]]:
    """A child in its own process group whose main thread has exited, listening on a port it prints."""
    proc = leaderless.spawn("--listen", stdout=subprocess.PIPE, start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(stat_fields(f.read())[19])


def _end(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()  # the reader thread ends the process at EOF
    assert proc.wait(10) == 0


def test_stat_fields_follow_the_last_parenthesis() -> None:
    """A command name may hold spaces and parentheses."""
    assert stat_fields(b"42 (a) b (c)) S 1 42 42") == [b"S", b"1", b"42", b"42"]


def test_a_process_whose_main_thread_exited_runs_until_its_last_thread_ends(
    headless: subprocess.Popen[bytes],
) -> None:
    """Its leader shows Z, yet it holds its listening socket: running, started, a group member; then gone."""
    pid = headless.pid
    assert headless.stdout is not None
    port = int(headless.stdout.readline())
    assert leaderless.leader_state(pid) == "Z"
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # it still holds its listening socket
    assert any_thread_running(pid)
    assert process_start(pid) == _start_time(pid)
    assert _group_members(pid) == [pid]
    _end(headless)
    assert not any_thread_running(pid)
    assert process_start(pid) is None
    assert _group_members(pid) == []


def test_a_zombie_has_ended() -> None:
    """Every thread exited, not reaped yet: /proc still lists it, and it counts as gone."""
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, start_new_session=True)
    try:
        proc.kill()
        leaderless.wait_leaderless(proc.pid)  # Z, and not reaped: nobody has waited for it
        assert not any_thread_running(proc.pid)
        assert process_start(proc.pid) is None
        assert _group_members(proc.pid) == []
    finally:
        proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()


def test_a_process_that_is_gone_is_neither_running_nor_started() -> None:
    """Reaped: no /proc entry at all."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not any_thread_running(proc.pid)
    assert process_start(proc.pid) is None
