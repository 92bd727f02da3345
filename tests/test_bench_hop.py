"""``pubsubclub bench --scenario hop``: the host's one-hop probe, its receiver alone and one tiny real run.

Never a latency value is asserted: only counts, order and bounds.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers.nodes import REPO

from pubsubclub.bench.hop import MESSAGE, receive, run_hop_bench, take_stamps
from pubsubclub.bench.nodes import steal_text
from pubsubclub.cli.command import parser


def _send_then_close(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)


def test_the_receiver_times_whole_messages_and_stops_when_the_sender_closes() -> None:
    """Three whole messages and half of a fourth, then close: three latencies, the half message not counted."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        now = time.time()
        data = b"".join(MESSAGE.pack(i, now) for i in range(4))[: MESSAGE.size * 3 + MESSAGE.size // 2]
        sender = threading.Thread(target=_send_then_close, args=(listener.getsockname()[1], data))
        sender.start()
        latencies = receive(listener, 5, time.time() + 30)
        sender.join(10)
    assert len(latencies) == 3 and all(0 <= lat < 30 for lat in latencies)


def test_a_message_split_anywhere_is_read_once_whole() -> None:
    """Two messages cut at every byte offset into two chunks: both stamps, in order, and nothing left over."""
    data = MESSAGE.pack(0, 1.5) + MESSAGE.pack(1, 2.5)
    for cut in range(len(data) + 1):
        first, rest = take_stamps(data[:cut])
        second, rest = take_stamps(rest + data[cut:])
        assert (first + second, rest) == ([1.5, 2.5], b""), cut


def test_a_sender_that_never_connects_is_an_error_not_a_hang() -> None:
    """Nobody connects by the deadline: the receiver says so instead of waiting on."""
    with socket.create_server(("127.0.0.1", 0)) as listener, pytest.raises(SystemExit, match="did not connect"):
        receive(listener, 5, time.time() + 0.2)


def test_the_receiver_gives_up_at_its_deadline_on_a_silent_sender() -> None:
    """A sender that connects and sends nothing: the receiver returns what it has (nothing) at its deadline."""
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()):
        assert receive(listener, 5, time.time() + 0.2) == []


@pytest.mark.parametrize("flags", [("--client", "lean"), ("--target", "ws://a", "ws://b"), ("--rate", "0")])
def test_hop_refuses_what_it_does_not_take(flags: tuple[str, ...]) -> None:
    """The probe starts its own two processes at --rate: no target, no client choice, a rate of at least 1."""
    args = parser().parse_args(["bench", "--scenario", "hop", *flags])
    with pytest.raises(SystemExit, match=r"^pubsubclub: error: "):
        run_hop_bench(args)


@pytest.mark.slow
def test_a_real_hop_run_delivers_every_message_and_reports_ordered_figures() -> None:
    """200 paced messages: all received, none lost, p50 <= p99 <= p99.9 <= max, the machine described."""
    result = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "hop", "--latency-count", "200", "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert results["scenario"] == "hop" and "load_average" in results["machine"]
    lat = results["latency"]
    assert (lat["sent"], lat["received"], lat["lost"], lat["client"]) == (200, 200, 0, "hop")
    assert isinstance(lat["steal_seconds"], float)
    m = lat["latency_ms"]
    assert 0 < m["p50"] <= m["p99"] <= m["p999"] <= m["max"] and len(lat["slowest_positions"]) == 5


def test_the_text_line_says_what_the_host_stole_when_it_is_known() -> None:
    """A latency run's steal on its text line; nothing when unknown (no /proc/stat column)."""
    assert steal_text({"steal_seconds": 0.25}) == "; the host stole 0.25 s of CPU during it"
    assert steal_text({"steal_seconds": None}) == "" and steal_text({}) == ""


@pytest.mark.slow
def test_a_real_hop_run_in_text_names_its_figures_and_the_steal() -> None:
    """Without --json: one line with the percentiles, the count sent and lost, and the steal (Linux has it)."""
    result = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "hop", "--latency-count", "100"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.strip().splitlines()
    assert line.startswith("one hop at 1000/s: p50 ") and "sent 100, lost 0; the host stole " in line
