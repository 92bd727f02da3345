"""``pubsubclub bench --scenario tail``: the bar's verdict from fabricated runs, one tiny real run, refusals, failures.

The verdict is a pure function of the run records, tested with made-up
figures. The real run is tiny (2 pairs of 200 paced messages) and asserts
only structure, order and that nothing is lost or left running: never a
latency value.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers.nodes import REPO
from helpers.procfs import assert_gone

from pubsubclub.bench.nodes import libpython, machine, steal_seconds
from pubsubclub.bench.tail import check_tail_args, run_child, run_tail_bench, verdict
from pubsubclub.cli.command import parser


def run(kind: str, pair: int, p99: float | None, lost: int = 0, **more: Any) -> dict[str, Any]:
    """A fabricated run record with ``p99`` (the other percentiles derived from it)."""
    record: dict[str, Any] = {
        "kind": kind, "pair": pair, "position": 0, "p50": None if p99 is None else p99 / 2, "p99": p99,
        "p999": None if p99 is None else p99 * 2, "max": None if p99 is None else p99 * 3, "lost": lost,
        "server_cpu_us_per_msg": 100.0,
    }  # fmt: skip
    if kind == "nodes":
        record["throughput_lost"] = 0
    return {**record, **more}


def tail_args(*flags: str) -> argparse.Namespace:
    """``pubsubclub bench --scenario tail FLAGS`` as parsed, with the defaults the bench fills in given explicitly."""
    return parser().parse_args(
        ["bench", "--scenario", "tail", "--runs", "2", "--count", "500", "--transport", "websocket", *flags]
    )


# -- the verdict, a pure function of the runs --------------------------------------------------------------------------


def test_a_run_exactly_at_the_bar_meets_it() -> None:
    """p99 equal to the bar counts as met; a hair above does not, and names its pair."""
    v = verdict([run("nodes", 1, 1.0), run("nodes", 2, 1.0000001)], 1.0)
    assert v["nodes"]["met_runs"] == 1 and v["nodes"]["over_bar"] == [2] and v["nodes"]["met"] is False
    v = verdict([run("nodes", 1, 1.0), run("nodes", 2, 0.5)], 1.0)
    assert (v["nodes"]["met_runs"], v["nodes"]["met"], v["nodes"]["over_bar"]) == (2, True, [])


def test_a_lost_message_fails_the_run_whatever_its_p99() -> None:
    """A message lost in the latency run, or in the nodes' throughput run, fails that run though its p99 is low."""
    v = verdict([run("nodes", 1, 0.5, lost=1), run("nodes", 2, 0.5, throughput_lost=3), run("nodes", 3, 0.5)], 1.0)
    assert (v["nodes"]["met_runs"], v["nodes"]["met"], v["nodes"]["lost"], v["nodes"]["over_bar"]) == (1, False, [1, 2],
                                                                                                        [])  # fmt: skip


def test_a_run_without_a_p99_does_not_meet_the_bar() -> None:
    """A run with no latency figures (no message arrived) is counted over the bar and left out of the medians."""
    v = verdict([run("nodes", 1, None, lost=200), run("nodes", 2, 0.8)], 1.0)
    assert v["nodes"]["over_bar"] == [1] and v["nodes"]["median_ms"]["p99"] == 0.8


def test_medians_of_an_even_count_are_the_mean_of_the_middle_two() -> None:
    """Four runs: each percentile's median is the mean of the two middle values."""
    v = verdict([run("nodes", i + 1, p99) for i, p99 in enumerate((0.9, 1.3, 0.7, 1.1))], 1.0)
    m = v["nodes"]["median_ms"]
    assert m["p99"] == pytest.approx(1.0) and m["p50"] == pytest.approx(0.5) and m["max"] == pytest.approx(3.0)
    assert v["nodes"]["median_server_cpu_us_per_msg"] == 100.0 and v["nodes"]["over_bar"] == [2, 4]


def test_the_paired_difference_is_each_pairs_nodes_p99_minus_its_floor_p99() -> None:
    """Each pair's nodes p99 minus the same pair's floor p99, in pair order, and their median; both sides judged."""
    runs = [run("floor", 1, 0.8), run("nodes", 1, 0.95), run("floor", 2, 1.05), run("nodes", 2, 1.1),
            run("floor", 3, 0.7), run("nodes", 3, 1.0)]  # fmt: skip
    v = verdict(runs, 1.0)
    assert v["paired_p99_ms"] == pytest.approx([0.15, 0.05, 0.3]) and v["median_paired_p99_ms"] == pytest.approx(0.15)
    assert (v["nodes"]["met_runs"], v["nodes"]["over_bar"]) == (2, [2])
    assert (v["floor"]["met_runs"], v["floor"]["over_bar"], v["floor"]["met"]) == (2, [2], False)


def test_without_floor_runs_the_floor_fields_are_none() -> None:
    """``--no-floor``: only the nodes are judged; the floor's side and the paired difference are None."""
    v = verdict([run("nodes", 1, 0.9), run("nodes", 2, 0.8)], 1.0)
    assert (v["floor"], v["paired_p99_ms"], v["median_paired_p99_ms"], v["host"]) == (None, None, None, None)
    assert v["nodes"]["met"] is True and v["bar_ms"] == 1.0


def test_the_host_verdict_names_the_quiet_pairs_and_judges_the_nodes_runs_in_them() -> None:
    """Quiet pair: the hop runs before and after it at or under --quiet-ms, nothing lost; its nodes' runs judged alone.

    Hop run k opens pair k; the last (pair 5 here) closes pair 4. The headline
    is untouched: the nodes missed the bar in 2 of 4 runs whatever the host did.
    """
    runs = [run("host", 1, 0.2), run("nodes", 1, 0.7), run("host", 2, 0.3), run("nodes", 2, 1.4),
            run("host", 3, 0.2), run("nodes", 3, 3.0), run("host", 4, 0.9), run("nodes", 4, 0.6),
            run("host", 5, 0.1)]  # fmt: skip
    v = verdict(runs, 1.0, quiet_ms=0.3)
    assert (v["nodes"]["met_runs"], v["nodes"]["over_bar"], v["nodes"]["met"]) == (2, [2, 3], False)
    host = v["host"]
    assert host["quiet_pairs"] == [1, 2] and host["p99_ms"] == [0.2, 0.3, 0.2, 0.9, 0.1] and host["quiet_ms"] == 0.3
    assert host["nodes_on_quiet_pairs"] == {"runs": 2, "met_runs": 1, "over_bar": [2], "lost": []}
    assert host["median_ms"]["p99"] == pytest.approx(0.2)
    assert verdict(runs, 1.0, quiet_ms=1.0)["host"]["quiet_pairs"] == [1, 2, 3, 4]
    lost_after = runs[:-1] + [run("host", 5, 0.1, lost=1)]  # a hop run that lost a message is not quiet
    assert verdict(lost_after, 1.0, quiet_ms=1.0)["host"]["quiet_pairs"] == [1, 2, 3]
    assert verdict(runs[:-1], 1.0, quiet_ms=1.0)["host"]["quiet_pairs"] == [1, 2, 3, 4]  # no hop after: before alone


def test_a_pair_whose_floor_or_nodes_run_the_host_stole_from_is_not_quiet() -> None:
    """Steal over --quiet-steal in the pair's floor or nodes run: not quiet (a hop run's steal, or none known: fine)."""
    runs = [run("host", 1, 0.1, steal_seconds=0.9), run("floor", 1, 0.8, steal_seconds=0.0),
            run("nodes", 1, 0.7, steal_seconds=0.05), run("host", 2, 0.1), run("floor", 2, 0.8, steal_seconds=0.3),
            run("nodes", 2, 0.7), run("host", 3, 0.1), run("floor", 3, 0.8), run("nodes", 3, 4.0, steal_seconds=0.6),
            run("host", 4, 0.1)]  # fmt: skip
    host = verdict(runs, 1.0, quiet_ms=0.3, quiet_steal=0.05)["host"]
    assert (host["quiet_pairs"], host["stolen_pairs"], host["quiet_steal_seconds"]) == ([1], [2, 3], 0.05)
    assert host["nodes_on_quiet_pairs"] == {"runs": 1, "met_runs": 1, "over_bar": [], "lost": []}
    assert verdict(runs, 1.0, quiet_ms=0.3, quiet_steal=1.0)["host"]["quiet_pairs"] == [1, 2, 3]


# -- refusals, before anything starts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [("--target", "ws://a", "ws://b"), ("--window", "100"), ("--workers", "2"), ("--serializer", "msgpack"),
     ("--transport", "rawsocket"), ("--nodes", "1"), ("--subscribers", "4"), ("--runs", "0"),
     ("--runs", "101"), ("--bar-ms", "0"), ("--quiet-ms", "0"), ("--quiet-steal", "-1"), ("--rate", "0"),
     ("--max-seconds", "0"), ("--acknowledge",)],
    ids=lambda flags: " ".join(flags),
)  # fmt: skip
def test_tail_refuses_what_the_bars_runs_do_not_take(flags: tuple[str, ...]) -> None:
    """Options that do not apply to the default bench or the floor, and out-of-range ones, are refused by name."""
    with pytest.raises(SystemExit, match=r"^pubsubclub: error: .*(" + re.escape(flags[0]) + ")"):
        check_tail_args(tail_args(*flags))
    check_tail_args(tail_args("--no-floor", "--bar-ms", "1.5", "--size", "10", "--realm", "r", "--nodes", "2"))


def test_tail_refusal_comes_before_any_run() -> None:
    """From the command line: the error on stderr, exit status 1, and no run started."""
    result = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "tail", "--workers", "2"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 1 and "pubsubclub: error: --scenario tail" in result.stderr
    assert "--workers" in result.stderr and "run 1" not in result.stderr and result.stdout == ""


LEAN_RESULT = {
    "machine": {"load_average": 0.5},
    "latency": {"latency_ms": {"p50": 0.3, "p99": 0.7, "p999": 0.9, "max": 1.1}, "sent": 10, "received": 10, "lost": 0,
                "server_cpu_us_per_msg": 220.0, "slowest_positions": [1, 2, 3, 4, 5]},
    "throughput": {"sent": 500, "received": 500, "lost": 0, "delivered_rate": 50000.0, "server_cpu_us_per_msg": 9.0},
}  # fmt: skip


def option(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv``, None if it is not there."""
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_tail_with_lean_clients_pairs_lean_nodes_runs_with_the_lean_floor() -> None:
    """``--client lean``: floor, nodes, floor, ... as for Autobahn clients, every child with ``--client lean``, the
    nodes' over WebSocket; ``--transport rawsocket``: the lean nodes runs over RawSocket and no floor."""
    seen: list[list[str]] = []

    def runner(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
        seen.append(argv)
        return 0, json.dumps(LEAN_RESULT), ""

    assert run_tail_bench(tail_args("--runs", "2", "--client", "lean", "--no-host-probe"), runner) == 0
    assert [option(argv, "--scenario") for argv in seen] == ["floor", None, "floor", None]
    assert all(option(argv, "--client") == "lean" for argv in seen)
    assert [option(argv, "--transport") for argv in seen] == [None, "websocket", None, "websocket"]
    seen.clear()
    args = tail_args("--runs", "3", "--client", "lean", "--transport", "rawsocket", "--no-host-probe")
    assert run_tail_bench(args, runner) == 0
    assert len(seen) == 3 and all(option(argv, "--scenario") is None for argv in seen)
    assert all((option(argv, "--client"), option(argv, "--transport")) == ("lean", "rawsocket") for argv in seen)
    seen.clear()
    run_tail_bench(tail_args("--runs", "1", "--no-host-probe"), runner)  # Autobahn clients, floor first
    assert [option(argv, "--scenario") for argv in seen] == ["floor", None]
    assert all(option(argv, "--client") == "autobahn" and "--transport" not in argv for argv in seen)


def test_tail_takes_rawsocket_only_with_lean_clients() -> None:
    """``--transport rawsocket`` is refused with the Autobahn clients (their floor is WebSocket) and taken with lean."""
    with pytest.raises(SystemExit, match="--transport"):
        check_tail_args(tail_args("--transport", "rawsocket"))
    check_tail_args(tail_args("--client", "lean", "--transport", "rawsocket"))


# -- a failing or hanging child ----------------------------------------------------------------------------------------

FLOOR_RESULT = {
    "machine": {"load_average": 0.5},
    "latency": {"latency_ms": {"p50": 0.5, "p99": 0.9, "p999": 1.0, "max": 1.2}, "sent": 10, "received": 10, "lost": 0,
                "server_cpu_us_per_msg": 140.0, "slowest_positions": [1, 2, 3, 4, 5]},
}  # fmt: skip


def test_a_failing_child_run_is_named_with_its_last_lines() -> None:
    """The floor run succeeds, the nodes run exits 3: the error names run 2 (nodes, pair 1), its status and stderr."""
    seen: list[list[str]] = []

    def runner(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
        seen.append(argv)
        if "floor" in argv:
            return 0, json.dumps(FLOOR_RESULT), ""
        return run_child([sys.executable, "-c", "import sys; print('bench: boom on node A', file=sys.stderr); "
                          "sys.exit(3)"], timeout)  # fmt: skip

    with pytest.raises(SystemExit) as raised:
        run_tail_bench(tail_args("--runs", "1", "--no-host-probe"), runner)
    message = str(raised.value.code)
    assert message.startswith("pubsubclub: error: bench --scenario tail: run 2 of 2 (nodes, pair 1 of 1)")
    assert "exited with status 3" in message and "bench: boom on node A" in message
    assert [argv[3:5] for argv in seen] == [["bench", "--scenario"], ["bench", "--count"]]


def test_a_child_that_prints_no_results_is_an_error() -> None:
    """Exit status 0 but no JSON on stdout: the run is named, nothing is judged."""
    with pytest.raises(SystemExit, match=r"run 1 of 2 \(floor, pair 1 of 1\) printed no usable results"):
        run_tail_bench(tail_args("--runs", "1", "--no-host-probe"), lambda argv, timeout: (0, "not json", ""))


HANGING_CHILD = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grand = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM,"
                              " signal.SIG_IGN); print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE)
    grand.stdout.readline()
    print(f"grandchild pid {grand.pid}", file=sys.stderr, flush=True)
    time.sleep(120)
""")


@pytest.mark.slow
def test_a_hanging_child_and_what_it_started_are_killed_and_named() -> None:
    """A child (and its grandchild) ignoring SIGTERM past the timeout: both killed, the run named as timed out."""
    pids: list[int] = []

    def runner(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
        status, out, err = run_child([sys.executable, "-c", HANGING_CHILD], 3, grace=0.5)
        pids.extend(int(p) for p in re.findall(r"grandchild pid (\d+)", err))
        return status, out, err

    with pytest.raises(SystemExit, match=r"run 1 of 1 \(nodes, pair 1 of 1\) did not end within") as raised:
        run_tail_bench(tail_args("--runs", "1", "--no-floor", "--no-host-probe"), runner)
    assert "grandchild pid" in str(raised.value.code) and len(pids) == 1
    assert_gone(pids)


# -- one tiny real run -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tail_run() -> tuple[dict[str, Any], str]:
    """``bench --scenario tail --runs 2`` with tiny runs: (results, stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "tail", "--runs", "2", "--latency-count", "200",
         "--count", "500", "--max-seconds", "20", "--json"],
        capture_output=True, text=True, timeout=400, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.slow
def test_tail_alternates_floor_and_nodes_runs_and_judges_both(tail_run: tuple[dict[str, Any], str]) -> None:
    """Two pairs: host, floor, nodes, host, floor, nodes; each run's figures, nothing lost, the verdict's fields."""
    results, err = tail_run
    machine_keys = {"cpus", "cpu_model", "python", "python_executable", "libpython", "load_average"}
    assert machine_keys <= results["machine"].keys()
    assert (results["scenario"], results["runs"], results["floor"]) == ("tail", 2, True)
    assert results["order"] == ["host", "floor", "nodes"]
    runs = sorted(results["nodes_runs"] + results["floor_runs"] + results["host_runs"], key=lambda r: r["position"])
    assert [(r["position"], r["kind"], r["pair"]) for r in runs] == [
        (1, "host", 1), (2, "floor", 1), (3, "nodes", 1), (4, "host", 2), (5, "floor", 2), (6, "nodes", 2),
        (7, "host", 3),
    ]  # fmt: skip
    assert err.index("run 1 of 7 (host") < err.index("run 2 of 7 (floor") < err.index("run 6 of 7 (nodes")
    assert err.index("run 6 of 7 (nodes") < err.index("run 7 of 7 (host, after pair 2)")
    for r in runs:
        assert (r["sent"], r["received"], r["lost"]) == (200, 200, 0) and isinstance(r["steal_seconds"], float)
        assert 0 < r["p50"] <= r["p99"] <= r["p999"] <= r["max"]
        assert r["server_cpu_us_per_msg"] >= 0 if r["kind"] != "host" else r["server_cpu_us_per_msg"] is None
    host = results["verdict"]["host"]
    assert host["quiet_ms"] == 0.3 and host["p99_ms"] == [r["p99"] for r in results["host_runs"]]
    assert host["nodes_on_quiet_pairs"]["runs"] == len(host["quiet_pairs"])
    assert all(r["throughput_lost"] == 0 and r["throughput"]["sent"] == 500 for r in results["nodes_runs"])
    v = results["verdict"]
    assert v["bar_ms"] == 1.0 and len(v["paired_p99_ms"]) == 2 and v["median_paired_p99_ms"] is not None
    for side in (v["nodes"], v["floor"]):
        assert side["runs"] == 2 and side["lost"] == [] and side["met_runs"] == 2 - len(side["over_bar"])
        assert set(side["median_ms"]) == {"p50", "p99", "p999", "max"}


@pytest.mark.slow
def test_tail_leaves_no_child_node_or_relay_behind(tail_run: tuple[dict[str, Any], str]) -> None:
    """After the run every child bench, node, relay and hop sender it started is gone."""
    _, err = tail_run
    children = [int(p) for p in re.findall(r"child pid (\d+)", err)]
    servers = [int(p) for line in err.splitlines() if "node pids:" in line or "relay pids:" in line
               for p in re.findall(r"\b[AB] (\d+)", line)]  # fmt: skip
    senders = [int(p) for p in re.findall(r"hop sender pid (\d+)", err)]
    assert len(children) == 7 and len(servers) == 8 and len(senders) == 3
    assert_gone(children + servers + senders)


@pytest.mark.slow
def test_tail_stopped_with_sigterm_stops_its_child_and_what_it_started() -> None:
    """SIGTERM to the tail bench mid-run: it exits, and its child bench and the child's relays are gone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "tail", "--runs", "1", "--latency-count", "60000",
         "--max-seconds", "60", "--no-host-probe"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO,
    )  # fmt: skip
    pids: list[int] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            pids += [int(p) for p in re.findall(r"child pid (\d+)", line)]
            if "relay pids:" in line:
                pids += [int(p) for p in re.findall(r"\b[AB] (\d+)", line)]
                break
        assert len(pids) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
        assert_gone(pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_tail_with_lean_clients_for_real_judges_the_lean_runs_and_their_floor() -> None:
    """A tiny real ``--client lean`` check: one lean floor run and one lean nodes run (200 paced, 500 in the
    throughput run), both over WebSocket, nothing lost, the paired difference computed."""
    result = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "tail", "--client", "lean", "--runs", "1",
         "--latency-count", "200", "--count", "500", "--max-seconds", "20", "--json"],
        capture_output=True, text=True, timeout=200, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    assert (results["client"], results["transport"], results["floor"]) == ("lean", "websocket", True)
    assert results["order"] == ["host", "floor", "nodes"]
    assert [(r["pair"], r["lost"]) for r in results["host_runs"]] == [(1, 0), (2, 0)]
    (r,) = results["nodes_runs"]
    assert (r["sent"], r["received"], r["lost"], r["throughput_lost"], r["throughput"]["sent"]) == (200, 200, 0, 0, 500)
    (f,) = results["floor_runs"]
    assert (f["sent"], f["received"], f["lost"]) == (200, 200, 0)
    assert all(isinstance(run["steal_seconds"], float) for run in [r, f, *results["host_runs"]])  # /proc/stat has it
    assert 0 < r["p50"] <= r["p99"] <= r["p999"] <= r["max"]
    v = results["verdict"]
    assert v["nodes"]["runs"] == v["floor"]["runs"] == 1
    assert v["paired_p99_ms"] == [pytest.approx(r["p99"] - f["p99"])]
    assert "lean latency run" in result.stderr and "--client lean --transport websocket" in result.stderr


def test_the_host_probe_runs_before_each_pair_and_once_after_and_its_line_is_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """By default: hop, nodes, hop, nodes, hop (with --no-floor); the text ends with the host's quiet pairs."""
    seen: list[list[str]] = []

    def runner(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
        seen.append(argv)
        return 0, json.dumps(LEAN_RESULT), ""

    assert run_tail_bench(tail_args("--client", "lean", "--no-floor", "--quiet-ms", "0.8"), runner) == 0
    scenarios = [argv[argv.index("--scenario") + 1] if "--scenario" in argv else "wamp" for argv in seen]
    assert scenarios == ["hop", "wamp", "hop", "wamp", "hop"]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("host: one hop's p99") and "steal <= 0.05 s in the pair's runs): 1, 2;" in last


def test_each_run_carries_the_steal_time_its_latency_run_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """A child's ``latency.steal_seconds`` becomes the run's; a child without one (unknown) gives None."""
    with_steal = {**LEAN_RESULT, "latency": {**LEAN_RESULT["latency"], "steal_seconds": 0.25}}
    replies = iter([with_steal, LEAN_RESULT])
    assert run_tail_bench(tail_args("--runs", "2", "--client", "lean", "--no-floor", "--no-host-probe", "--json"),
                          lambda argv, timeout: (0, json.dumps(next(replies)), "")) == 0  # fmt: skip
    captured = capsys.readouterr()
    results = json.loads(captured.out)
    assert [r["steal_seconds"] for r in results["nodes_runs"]] == [0.25, None]
    assert results["verdict"]["nodes"]["steal_seconds"] == [0.25, None]
    assert "servers' CPU 220.0 us/msg; steal 0.25 s" in captured.err


def test_steal_seconds_reads_the_cpu_lines_steal_column(tmp_path: Path) -> None:
    """The eighth number of /proc/stat's ``cpu`` line, in clock ticks; None without the file or the column."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4 5 6 7 250 0 0\ncpu0 1 2 3 4 5 6 7 125 0 0\n")
    assert steal_seconds(str(stat)) == 250 / os.sysconf("SC_CLK_TCK")
    stat.write_text("cpu  1 2 3 4\n")
    assert steal_seconds(str(stat)) is None and steal_seconds(str(tmp_path / "missing")) is None


def test_the_machine_names_the_interpreter_and_its_libpython(tmp_path: Path) -> None:
    """Every bench's ``machine`` says which interpreter ran it: the executable, and a shared libpython or "static"."""
    maps = tmp_path / "maps"
    lib = "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0"
    maps.write_text(
        "55d0c000-55d0d000 r--p 00000000 fe:01 1 /usr/bin/python3.11\n"
        f"7f00a000-7f00b000 r--p 00000000 fe:01 2 {lib}\n"
        f"7f00b000-7f00c000 r-xp 00001000 fe:01 2 {lib}\n"
        "7f00d000-7f00e000 rw-p 00000000 00:00 0 \n"
    )
    assert libpython(str(maps)) == lib
    maps.write_text(
        "55d0c000-55d0d000 r-xp 00000000 fe:01 1 /usr/bin/python3.11\n"
        "7f00d000-7f00e000 rw-p 00000000 00:00 0\n"
    )
    assert libpython(str(maps)) == "static"
    assert libpython(str(tmp_path / "missing")) is None
    here = machine()
    assert here["python_executable"] == os.path.realpath(sys.executable)
    assert here["libpython"] == libpython()
