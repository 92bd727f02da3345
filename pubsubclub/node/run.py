"""Running a node process: logging, the reactor, signals."""

from __future__ import annotations

import errno
import signal
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.logger import (
    FilteringLogObserver,
    ILogFilterPredicate,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    PredicateResult,
    globalLogBeginner,
    textFileLogObserver,
)
from zope.interface import implementer

from pubsubclub.config import NodeConfig

#: Twisted's factory chatter: an object repr per listener and connection, at info; shown at debug only.
CHATTER_FORMATS = frozenset({"Starting factory {factory!r}", "Stopping factory {factory!r}"})


@implementer(ILogFilterPredicate)
class chatter_below:  # noqa: N801 (a predicate, used like a function)
    """A log filter predicate that drops :data:`CHATTER_FORMATS` events unless ``level`` is debug."""

    def __init__(self, level: LogLevel) -> None:
        self.level = level

    def __call__(self, event: Any) -> PredicateResult:
        """``no`` for factory chatter below debug, else ``maybe`` (the level filter decides)."""
        if self.level > LogLevel.debug and event.get("log_format") in CHATTER_FORMATS:
            return PredicateResult.no
        return PredicateResult.maybe


@implementer(ILogObserver)
class readable_retries:  # noqa: N801 (an observer wrapper, used like a function)
    """``observer``, with ClientService's "Scheduling retry ... to connect <...Endpoint object at 0x...>" made
    readable: the endpoint's host:port instead of its repr, the delay in hundredths of a second."""

    def __init__(self, observer: ILogObserver) -> None:
        self.observer = observer

    def __call__(self, event: Any) -> None:
        """Pass ``event`` on, rewritten if it is a ClientService retry."""
        if str(event.get("log_format", "")).startswith("Scheduling retry {attempt} to connect {endpoint}"):
            endpoint = event.get("endpoint")
            host = getattr(endpoint, "_hostText", None) or getattr(endpoint, "_host", None)
            where = f"{host}:{getattr(endpoint, '_port', '?')}" if host else type(endpoint).__name__
            delay = event.get("delay")
            event = {**event, "endpoint": where, "delay": round(delay, 2) if isinstance(delay, float) else delay}
        self.observer(event)


@implementer(ILogObserver)
class tagged:  # noqa: N801 (an observer wrapper, used like a function)
    """``observer``, with ``tag`` before every event's namespace (a worker's lines say which worker wrote them)."""

    def __init__(self, observer: ILogObserver, tag: str) -> None:
        self.observer = observer
        self.tag = tag

    def __call__(self, event: Any) -> None:
        """Pass ``event`` on, its namespace tagged."""
        event = {**event, "log_namespace": f"{self.tag} {event.get('log_namespace', '-')}"}
        if "log_system" in event:  # Twisted's legacy lines show their system instead of the namespace
            event["log_system"] = f"{self.tag} {event['log_system']}"
        self.observer(event)


def start_logging(level: str, tag: str | None = None) -> None:
    """Log to stderr at ``level`` and above (Twisted's "Starting factory" lines at debug only); ``tag``: see tagged."""
    threshold = LogLevel.levelWithName(level)
    predicate = LogLevelFilterPredicate(defaultLogLevel=threshold)
    output: ILogObserver = readable_retries(textFileLogObserver(sys.stderr))
    if tag is not None:
        output = tagged(output, tag)
    observer = FilteringLogObserver(output, [chatter_below(threshold), predicate])
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


def listen_failure(config: NodeConfig, error: CannotListenError) -> str:
    """What to say when a listener cannot bind: which flag, which endpoint, why, and what to change."""
    reason = getattr(error.socketError, "strerror", None) or str(error.socketError)
    where = f"{error.interface or '*'}:{error.port}"
    for key, endpoint in config.listeners().items():
        if _endpoint_port(endpoint) == error.port:
            hint = f"pick another port with --{key}"
            if getattr(error.socketError, "errno", None) == errno.EACCES and error.port < 1024:
                hint += " (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
            return f"--{key} {endpoint}: cannot listen on {where}: {reason.lower()}; {hint}"
    return f"cannot listen on {where}: {reason.lower()}"


def _endpoint_port(endpoint: str) -> int | None:
    """The port of a ``tcp:``/``ssl:`` server endpoint string (positional or ``port=``), None if it has none."""
    parts = endpoint.split(":")
    for part in parts[1:]:
        if part.startswith("port="):
            part = part.removeprefix("port=")
        if part.isdigit():
            return int(part)
    return None


def node_reactor() -> Any:
    """The reactor a node runs on: pubsubclub.net.reactor's, installed unless a reactor is already installed."""
    from pubsubclub.net.reactor import install

    install()
    from twisted.internet import reactor

    return reactor


def run_node(config: NodeConfig, bridge: bool = False, on_ready: Callable[[Any], None] | None = None) -> int:
    """Run one node (``bridge``: a bridge node) until SIGINT/SIGTERM; links are closed with a reason on the way out.

    ``on_ready(node)`` runs once the node is up and has printed its ready line
    (the link bench drives the node's hub from inside the process with it).
    """
    from pubsubclub.node.workers import WorkerPlace, worker_config

    place = None if bridge else WorkerPlace.from_environment()
    start_logging(config.node.log_level, None if place is None else f"worker {place.index}")
    import txaio

    txaio.use_twisted()
    reactor = node_reactor()

    from pubsubclub.node.node import Node, print_ready

    exit_code = [0]
    declared = config
    if place is not None:
        config = worker_config(config, place)
        _stop_with_supervisor()

    async def start() -> None:
        node = Node(config, reactor, bridge=bridge, place=place, declared=declared)
        try:
            urls = await node.start()
        except CannotListenError as e:  # a port in use is a configuration error: name the flag, exit 2
            print(f"pubsubclub: error: {listen_failure(config, e)}", file=sys.stderr)
            exit_code[0] = 2
            reactor.stop()  # type: ignore[attr-defined]
            return
        except Exception as e:  # a listener could not start: report it, exit non-zero
            print(f"pubsubclub: error: cannot start node: {e}", file=sys.stderr)
            exit_code[0] = 1
            reactor.stop()  # type: ignore[attr-defined]
            return
        # Graceful shutdown on SIGTERM/SIGINT: close links with a reason first, within shutdown-timeout.
        reactor.addSystemEventTrigger(  # type: ignore[attr-defined]
            "before", "shutdown", lambda: node.stop_within(config.node.shutdown_timeout)
        )
        # Everything allocated so far lives as long as the process: keep it out
        # of the cyclic GC's full collections, which otherwise stall the
        # reactor for tens of milliseconds (measured with `pubsubclub bench`);
        # with gc-refreeze, so is what survives each later full collection
        # (pubsubclub/node/collector.py).
        node.collector.start(reactor)
        print_ready(node, urls)
        if on_ready is not None:
            on_ready(node)

    reactor.callWhenRunning(lambda: defer.ensureDeferred(start()))  # type: ignore[attr-defined]
    _stop_on_signals(reactor)
    reactor.run(installSignalHandlers=False)  # type: ignore[attr-defined,call-arg]
    # A signal arriving while the interpreter exits would meet the default
    # action again (Python resets its handlers) and turn exit 0 into -15.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return exit_code[0]


def _stop_with_supervisor() -> None:
    """A worker gets SIGTERM when its supervisor dies (Linux ``PR_SET_PDEATHSIG``): no orphaned workers.

    Elsewhere (or without libc) nothing is set; a supervisor that is
    SIGKILLed then leaves its workers to be stopped by hand.
    """
    import ctypes
    import ctypes.util
    import os

    pr_set_pdeathsig = 1
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the supervisor died before prctl: it will not be signalled
        os.kill(os.getpid(), signal.SIGTERM)


def _stop_on_signals(reactor: Any) -> None:
    """SIGINT and SIGTERM stop the reactor once; later ones are ignored.

    Ctrl-C in a terminal reaches every process of ``pubsubclub cluster``, which
    then sends SIGTERM as well: Twisted's own handlers would call
    ``reactor.stop`` twice and log ``ReactorNotRunning`` as critical.
    """
    stopping = [False]

    def handler(signum: int, frame: Any) -> None:
        if stopping[0]:
            return
        stopping[0] = True
        log_signal = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
        reactor.callFromThread(_stop, reactor, log_signal)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _stop(reactor: Any, name: str) -> None:
    from twisted.logger import Logger

    Logger().info("received {signal}, shutting down", signal=name)
    if reactor.running:
        reactor.stop()
