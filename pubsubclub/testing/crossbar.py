"""A real Crossbar.io router as a child process, for the bridge's tests and benches.

Why it exists: ``pubsubclub bridge`` joins an unmodified WAMP router, and the
router people run is Crossbar.io, so the bridge is tested against the real
thing (issue 11). Crossbar pins old dependencies, so it lives in its own
virtualenv (``make crossbar`` builds ``.crossbar-venv``); this module finds its
``crossbar`` executable through ``$PUBSUBCLUB_CROSSBAR`` (default
``<repo>/.crossbar-venv/bin/crossbar``) and fails with a clear message when it
is missing: the bridge tests must fail, not skip, on a machine without it.

:func:`router_config` builds the node's ``config.json`` from Python (the one
docs/bridge.md shows, see :func:`example_config`); :class:`CrossbarProcess`
writes it into a node directory, starts ``crossbar start``, waits for the
node's "configuration ran successfully" log line and the WebSocket port, and
offers ``stop`` (SIGTERM), ``kill`` (SIGKILL), ``restart`` and its log.

Blocking by design, like the tests' ``NodeProcess``: the router lives in
another process, and every wait has a bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pubsubclub.core.proc import ENDED_STATES, any_thread_running, stat_fields

#: The repository root (``pubsubclub/testing/crossbar.py`` -> three levels up).
REPO = Path(__file__).resolve().parent.parent.parent
#: Environment variable naming the ``crossbar`` executable.
CROSSBAR_ENV = "PUBSUBCLUB_CROSSBAR"
#: Where ``make crossbar`` puts it.
DEFAULT_CROSSBAR = REPO / ".crossbar-venv" / "bin" / "crossbar"
#: The log line Crossbar writes once every configured worker and transport is up.
READY_LINE = "local node configuration ran successfully"
#: The ``--loglevel`` values at which Crossbar prints READY_LINE.
_READY_LEVELS = ("info", "debug", "trace")
#: Crossbar 26.10 starts in ~3-6 s on an idle machine; two cores shared by a test suite need more.
START_SECONDS = 60.0
#: Bound for a stop (SIGTERM) before the process is killed.
STOP_SECONDS = 20.0

#: The role the bridge's sessions get (docs/bridge.md): every session with it counts as a bridge.
BRIDGE_ROLE = "pubsubclub-bridge"
#: A role for authenticated application clients in the tests.
CLIENT_ROLE = "app"

#: Everything a role may do (the router's meta API ``wamp.*`` included).
ALLOW_ALL = {"call": True, "register": True, "publish": True, "subscribe": True}


def _group_members(pgid: int) -> list[int]:
    """Running processes of process group ``pgid``, from ``/proc``.

    Not the zombies, which hold no socket; but a process whose main thread
    has exited while another thread runs on is running, although ``/proc``
    shows its leader as a zombie (:mod:`pubsubclub.core.proc`): its threads
    still hold its listening sockets.
    """
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                state, _ppid, pgrp = stat_fields(f.read())[:3]
        except (OSError, ValueError):  # gone meanwhile
            continue
        if int(pgrp) == pgid and (state not in ENDED_STATES or any_thread_running(int(entry))):
            members.append(int(entry))
    return members


class CrossbarMissing(AssertionError):
    """``crossbar`` is not installed where we look: run ``make crossbar``."""


def crossbar_executable() -> Path:
    """The ``crossbar`` executable (``$PUBSUBCLUB_CROSSBAR`` or the Makefile's venv); raises if absent."""
    path = Path(os.environ.get(CROSSBAR_ENV) or DEFAULT_CROSSBAR)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise CrossbarMissing(
            f"Crossbar.io not found at {path}: run `make crossbar` (it creates .crossbar-venv with "
            f"crossbar from PyPI) or point ${CROSSBAR_ENV} at a crossbar executable"
        )
    return path


def permission(uri: str = "", match: str = "prefix", disclose_publisher: bool = False) -> dict[str, Any]:
    """One Crossbar permission entry allowing everything on ``uri`` (by ``match``)."""
    return {
        "uri": uri,
        "match": match,
        "allow": dict(ALLOW_ALL),
        "disclose": {"caller": False, "publisher": disclose_publisher},
        "cache": True,
    }


def role(name: str, permissions: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A Crossbar role; by default it may do everything, the meta API (``wamp.subscription.*``,
    ``wamp.session.*``) included, which is what a bridge needs."""
    return {"name": name, "permissions": [dict(p) for p in (permissions or [permission()])]}


@dataclass(frozen=True)
class Principal:
    """One authenticated identity of the router: a ticket, a WAMP-CRA secret, or both."""

    authid: str
    role: str
    ticket: str | None = None
    secret: str | None = None


#: The principals every test router knows: bridges (ticket and WAMP-CRA) and an application client.
DEFAULT_PRINCIPALS: tuple[Principal, ...] = (
    Principal("bridge-1", BRIDGE_ROLE, ticket="ticket-of-bridge-1", secret="secret-of-bridge-1"),
    Principal("bridge-2", BRIDGE_ROLE, ticket="ticket-of-bridge-2", secret="secret-of-bridge-2"),
    Principal("bridge-3", BRIDGE_ROLE, ticket="ticket-of-bridge-3", secret="secret-of-bridge-3"),
    Principal("client-1", CLIENT_ROLE, ticket="ticket-of-client-1", secret="secret-of-client-1"),
)


def transport_auth(principals: Iterable[Principal], anonymous: bool = True) -> dict[str, Any]:
    """The ``auth`` section of a transport: anonymous (role ``anonymous``), ticket and WAMP-CRA."""
    principals = tuple(principals)
    auth: dict[str, Any] = {}
    if anonymous:
        auth["anonymous"] = {"type": "static", "role": "anonymous"}
    tickets = {p.authid: {"ticket": p.ticket, "role": p.role} for p in principals if p.ticket}
    if tickets:
        auth["ticket"] = {"type": "static", "principals": tickets}
    users = {p.authid: {"secret": p.secret, "role": p.role} for p in principals if p.secret}
    if users:
        auth["wampcra"] = {"type": "static", "users": users}
    return auth


def router_config(
    port: int,
    realms: Sequence[str] = ("realm1",),
    principals: Iterable[Principal] = DEFAULT_PRINCIPALS,
    rawsocket_port: int | None = None,
    interface: str = "127.0.0.1",
    disclose_publisher: bool = False,
    extra_roles: Sequence[Mapping[str, Any]] = (),
    realm_extra: Mapping[str, Any] | None = None,
    worker_extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Crossbar ``config.json`` (version 2): one router worker, ``realms``, roles, transports.

    Roles: ``anonymous``, the application role ``app`` and the bridge role
    ``pubsubclub-bridge``, each allowed everything (the meta API included);
    ``extra_roles`` are added to every realm. Transports: a Web transport on
    ``interface:port`` with WebSocket at ``/ws`` (``ws://host:port/ws``), and a
    RawSocket transport on ``rawsocket_port`` if given, both with anonymous,
    ticket and WAMP-CRA authentication for ``principals``. ``realm_extra`` is
    merged into each realm (for example ``{"rlinks": [...]}``), ``worker_extra``
    into the router worker.
    """
    principals = tuple(principals)
    roles = [
        role(name, [permission(disclose_publisher=disclose_publisher)])
        for name in ("anonymous", CLIENT_ROLE, BRIDGE_ROLE)
    ]
    roles += [dict(r) for r in extra_roles]
    auth = transport_auth(principals)
    transports: list[dict[str, Any]] = [
        {
            "type": "web",
            "endpoint": {"type": "tcp", "interface": interface, "port": port},
            "paths": {
                "/": {"type": "json", "value": {"pubsubclub": "test router"}},
                "ws": {
                    "type": "websocket",
                    "serializers": ["json", "msgpack"],
                    "auth": auth,
                    # The router notices a vanished bridge within seconds, so its lock is freed.
                    "options": {"auto_ping_interval": 10000, "auto_ping_timeout": 5000},
                },
            },
        }
    ]
    if rawsocket_port is not None:
        transports.append(
            {
                "type": "rawsocket",
                "endpoint": {"type": "tcp", "interface": interface, "port": rawsocket_port},
                "serializers": ["json", "msgpack"],
                "auth": auth,
            }
        )
    worker: dict[str, Any] = {
        "type": "router",
        "realms": [{"name": realm, "roles": [dict(r) for r in roles], **dict(realm_extra or {})} for realm in realms],
        "transports": transports,
    }
    worker.update(worker_extra or {})
    return {"version": 2, "controller": {}, "workers": [worker]}


def example_config() -> dict[str, Any]:
    """The ``config.json`` docs/bridge.md shows (the tests' routers, on port 8080, one realm)."""
    return router_config(8080, realms=("realm1",))


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass
class CrossbarProcess:
    """One ``crossbar start`` process with a generated node directory.

    ``config`` defaults to :func:`router_config` on ``port`` (chosen by the
    caller; the router binds it itself). The log of every run is appended to
    ``<node_dir>/crossbar.log``.
    """

    node_dir: Path
    port: int
    config: dict[str, Any] = field(default_factory=dict)
    name: str = "crossbar"
    #: Crossbar's ``--loglevel``; above ``info`` its ready line is not printed and the open port is the sign.
    loglevel: str = "info"
    proc: subprocess.Popen[bytes] | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _reader: threading.Thread | None = None

    def __post_init__(self) -> None:
        if not self.config:
            self.config = router_config(self.port)

    @property
    def cbdir(self) -> Path:
        """The Crossbar node directory (``<node_dir>/.crossbar``), holding ``config.json``."""
        return self.node_dir / ".crossbar"

    @property
    def log_path(self) -> Path:
        """Where the router's output goes."""
        return self.node_dir / "crossbar.log"

    @property
    def url(self) -> str:
        """The WebSocket URL clients and bridges use."""
        return f"ws://127.0.0.1:{self.port}/ws"

    def log(self) -> str:
        """The router's log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def write_config(self) -> Path:
        """Write ``.crossbar/config.json``; returns its path."""
        self.cbdir.mkdir(parents=True, exist_ok=True)
        path = self.cbdir / "config.json"
        path.write_text(json.dumps(self.config, indent=2) + "\n")
        return path

    def start(self, timeout: float = START_SECONDS) -> CrossbarProcess:
        """Start the router and wait until it is ready (log line, then the port accepts)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} is already running")
        executable = crossbar_executable()
        self.write_config()
        self._ready.clear()
        env = dict(os.environ)
        # The child must not see our virtualenv's site-packages; Crossbar's venv has its own.
        # Nor a bytecode cache folder set for our own children (tests/conftest.py): Crossbar's venv
        # holds its compiled modules, and a fresh folder made every run compile all of them again.
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONPYCACHEPREFIX"):
            env.pop(var, None)
        self.proc = subprocess.Popen(
            [
                str(executable),
                "start",
                "--cbdir",
                str(self.cbdir),
                "--loglevel",
                self.loglevel,
                "--logformat",
                "standard",
                "--color",
                "false",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.node_dir,
            env=env,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._copy_log, args=(self.proc,), daemon=True, name=f"{self.name}-log")
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not (self._ready.wait(0.05) or (self.loglevel not in _READY_LEVELS and port_open(self.port))):
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(f"{self.name} exited with {self.proc.returncode} during start; log:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{self.name} did not get ready within {timeout:.0f} s; log:\n{self.log()}")
        while not port_open(self.port):
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{self.name} is ready but port {self.port} refuses; log:\n{self.log()}")
            time.sleep(0.05)
        return self

    def _copy_log(self, proc: subprocess.Popen[bytes]) -> None:
        """Copy the router's output into the log file and notice the ready line (a thread)."""
        assert proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if READY_LINE.encode() in line.lower():
                    self._ready.set()

    def running(self) -> bool:
        """Whether the process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_SECONDS) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code, or None if it was not running."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} ignored SIGTERM for {timeout:.0f} s; log:\n{self.log()}") from None
        # The controller can exit before its workers: a router worker still closing would keep the
        # port (a restart then seemed to serve while the old worker did). Wait for the group too.
        deadline = time.monotonic() + timeout
        while _group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _group_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"{self.name}'s workers outlived its controller by {timeout:.0f} s")
        self._join_reader()
        return code

    def kill(self) -> None:
        """``kill -9`` the router and its workers (its process group)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(STOP_SECONDS)
        # The workers are the controller's children, not ours: wait until the kernel has
        # ended them too (their sockets close only then), within the same bound.
        deadline = time.monotonic() + STOP_SECONDS
        while _group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._join_reader()

    def restart(self, timeout: float = START_SECONDS) -> CrossbarProcess:
        """Stop (SIGTERM) and start again on the same port and configuration."""
        self.stop()
        return self.start(timeout)

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(STOP_SECONDS)
            self._reader = None

    def __enter__(self) -> CrossbarProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
