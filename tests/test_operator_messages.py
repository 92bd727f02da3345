"""Operator-facing messages: warnings and errors that say what to do (issue 21)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.nodes import REPO, NodeProcess
from helpers.polling import WAIT_SECONDS, wait_until
from helpers.ports import free_port
from twisted.logger import LogLevel, PredicateResult

from pubsubclub.cli import command as cli
from pubsubclub.node.run import chatter_below


def test_world_readable_cluster_secret_gets_a_security_warning(tmp_path: Path) -> None:
    """A cluster secret every user may read logs a SECURITY WARNING naming it and chmod 600; a 0600 one does not."""
    secret = tmp_path / "cluster-secret"
    secret.write_text("0123456789abcdef" * 4 + "\n")
    logs = {}
    for mode in (0o644, 0o600):
        secret.chmod(mode)
        node = NodeProcess(f"mode{mode:o}", tmp_path, extra=("--cluster-secret-file", str(secret)))
        node.start()
        node.stop()
        logs[mode] = [line for line in node.log_path.read_text().splitlines() if "SECURITY WARNING" in line]
    assert len(logs[0o644]) == 1, logs[0o644]
    assert str(secret) in logs[0o644][0] and "chmod 600" in logs[0o644][0]
    assert logs[0o600] == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["node", "--peers", "ws://127.0.0.1:9002/psc"], "--peers: did you mean --peer?"),
        (["node", "--max-mesage-size=5"], "--max-mesage-size: did you mean --max-message-size?"),
        (["cluster", "--wamp-port", "18080"], "--wamp-port: did you mean --wamp-base-port?"),
        (["bridge", "--routr", "ws://127.0.0.1:8080/ws"], "--routr: did you mean --router?"),
    ],
)
def test_flag_typo_gets_did_you_mean_from_its_subcommand(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped flag exits 2 with the subcommand's usage and the nearest flag it has."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: pubsubclub {argv[0]}" in err and said in err


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('[consul]\nurll = "http://127.0.0.1:8500"\n', "did you mean url? (valid at [consul]: "),
        ("[federaton]\npeers = []\n", "did you mean [federation]?"),
        ('naem = "n1"\n', "did you mean name?"),
        ("consul_tll = 5\n", "did you mean [consul] ttl?"),
    ],
)
def test_unknown_toml_key_names_the_nearest_valid_one(
    tmp_path: Path, toml: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown TOML key exits 2 naming the nearest valid key and the keys valid where it stands."""
    config = tmp_path / "node.toml"
    config.write_text(toml)
    assert cli.main(["node", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "unknown key" in err and said in err


def test_port_in_use_names_the_flag_and_exits_2(tmp_path: Path) -> None:
    """A taken --psc port: the error names --psc, its endpoint and the fix, and the node exits 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoint = f"tcp:{port}:interface=127.0.0.1"
        done = subprocess.run(
            [sys.executable, "-m", "pubsubclub", "node", "--wamp", "tcp:0:interface=127.0.0.1", "--psc", endpoint],
            capture_output=True, text=True, cwd=REPO, timeout=WAIT_SECONDS,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        f"pubsubclub: error: --psc {endpoint}: cannot listen on 127.0.0.1:{port}: address already in use;"
        " pick another port with --psc"
    ) in done.stderr


def test_peer_without_psc_path_is_warned_and_factory_chatter_is_gone(tmp_path: Path) -> None:
    """--peer without /psc (or at /ws) logs the fixed URL; no object repr (factory chatter, retries) at info level."""
    port = free_port()
    node = NodeProcess("hints", tmp_path)
    node.peers = [f"ws://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/ws"]
    node.start()
    # Nothing listens on the port: the link's retry is logged, and must name host:port, not an endpoint repr.
    wait_until(lambda: "Scheduling retry" in node.log_path.read_text(), "a retry of the unreachable peer")
    node.stop()
    log = node.log_path.read_text()
    assert f"Scheduling retry 1 to connect 127.0.0.1:{port} in " in log
    assert f"--peer ws://127.0.0.1:{port} has no path" in log
    assert f"--peer ws://127.0.0.1:{port}/ws points at /ws, the WAMP listener's path" in log
    assert log.count(f"write --peer ws://127.0.0.1:{port}/psc") == 2
    assert "--log-level\ninfo" in "\n".join(node.command())  # info is the default level
    assert "Starting factory" not in log and "Stopping factory" not in log and " object at 0x" not in log


def test_factory_chatter_still_shows_at_debug() -> None:
    """The chatter filter only hides Twisted's factory lines below debug; other events pass."""
    event = {"log_format": "Starting factory {factory!r}", "log_level": LogLevel.info}
    assert chatter_below(LogLevel.info)(event) == PredicateResult.no
    assert chatter_below(LogLevel.debug)(event) == PredicateResult.maybe
    assert chatter_below(LogLevel.info)({"log_format": "node {name} ready"}) == PredicateResult.maybe
