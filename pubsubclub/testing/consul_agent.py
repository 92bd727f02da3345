"""Run the Consul double as an agent process, for tests that start real nodes.

::

    python -m pubsubclub.testing.consul_agent --port 8500 [--state-file FILE]

prints one JSON line ``{"event": "ready", "consul": "http://127.0.0.1:8500"}``
once it listens, and serves until SIGTERM or SIGINT. ``--state-file`` keeps
the state across restarts, like an agent with a data directory.
"""

from __future__ import annotations

import argparse
import json
import sys

from twisted.internet import defer

from pubsubclub.testing._consul import ConsulDouble


def main(argv: list[str] | None = None) -> int:
    """Serve the double on ``--interface:--port`` until the process is told to stop."""
    p = argparse.ArgumentParser(
        prog="python -m pubsubclub.testing.consul_agent", description="serve pubsubclub's Consul HTTP API double"
    )
    p.add_argument("--port", type=int, default=8500)
    p.add_argument("--interface", default="127.0.0.1")
    p.add_argument("--state-file", help="keep state in this file across restarts (like an agent's data dir)")
    args = p.parse_args(argv)

    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)
    double = ConsulDouble(reactor=reactor, state_file=args.state_file)
    failed: list[Exception] = []

    async def start() -> None:
        try:
            port = await double.listen(args.port, args.interface)
        except Exception as e:  # the port is taken: say so and exit non-zero
            print(f"consul double: cannot listen: {e}", file=sys.stderr)
            failed.append(e)
            reactor.stop()  # type: ignore[attr-defined]
            return
        print(json.dumps({"event": "ready", "consul": f"http://{args.interface}:{port}"}), flush=True)

    reactor.callWhenRunning(lambda: defer.ensureDeferred(start()))  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
