"""Running a node process: logging, the reactor, signals."""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import (
    FilteringLogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogBeginner,
    textFileLogObserver,
)

from pubsubclub.config import NodeConfig


def start_logging(level: str) -> None:
    """Log to stderr at ``level`` and above."""
    predicate = LogLevelFilterPredicate(defaultLogLevel=LogLevel.levelWithName(level))
    observer = FilteringLogObserver(textFileLogObserver(sys.stderr), [predicate])
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


def run_node(config: NodeConfig, bridge: bool = False, on_ready: Callable[[Any], None] | None = None) -> int:
    """Run one node (``bridge``: a bridge node) until SIGINT/SIGTERM; links are closed with a reason on the way out.

    ``on_ready(node)`` runs once the node is up and has printed its ready line
    (the link bench drives the node's hub from inside the process with it).
    """
    start_logging(config.node.log_level)
    import txaio

    txaio.use_twisted()
    from twisted.internet import reactor

    from pubsubclub.node import Node, print_ready

    exit_code = [0]

    async def start() -> None:
        node = Node(config, reactor, bridge=bridge)
        try:
            urls = await node.start()
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
        # reactor for tens of milliseconds (measured with `pubsubclub bench`).
        gc.collect()
        gc.freeze()
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
