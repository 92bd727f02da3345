"""``pubsubclub status``: one table of the cluster from the nodes' operations listeners (``GET /health``, ``/stats``).

Each ``--http`` URL is a node's ops listener (``--http`` of ``pubsubclub
node``). The table lists the nodes asked and every peer node their links
name, then every link with its state, direction, protocol version and the
messages it carried (forwarded on a link where the node is the producer,
received where it is the consumer), drops, gaps and replay counts. ``--watch``
redraws every N seconds and adds per-second rates computed between frames.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any, TextIO

#: Seconds one request to an ops listener may take.
FETCH_TIMEOUT = 5.0
#: ``--watch`` without a number: seconds between frames.
DEFAULT_WATCH_SECONDS = 2.0
DEFAULT_URL = "http://127.0.0.1:8181/"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``status`` subcommand's flags."""
    parser.add_argument(
        "--http",
        metavar="URL",
        action="append",
        help=f"a node's operations listener (its --http), repeatable (default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--watch",
        metavar="SECONDS",
        type=float,
        nargs="?",
        const=DEFAULT_WATCH_SECONDS,
        help=f"redraw every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C, with rates between frames",
    )
    parser.add_argument("--count", type=int, help="--watch: stop after this many frames (default: until Ctrl-C)")
    parser.add_argument("--json", action="store_true", help="print what the nodes said as JSON (one line per frame)")


class Unreachable(Exception):
    """An ops listener did not answer."""


def fetch(url: str) -> dict[str, Any]:
    """One node's ``/health`` status and ``/stats``, as ``{"url", "status", "stats"}``."""
    base = url if url.endswith("/") else url + "/"
    if "://" not in base:
        base = "http://" + base
    try:
        try:
            with urllib.request.urlopen(base + "health", timeout=FETCH_TIMEOUT) as r:
                health = json.loads(r.read())
        except urllib.error.HTTPError as e:  # 503 while starting or stopping, with the same body
            health = json.loads(e.read()) if e.code == 503 else {"status": f"HTTP {e.code}"}
        with urllib.request.urlopen(base + "stats", timeout=FETCH_TIMEOUT) as r:
            stats = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise Unreachable(f"{base}: HTTP {e.code} {e.reason} (is this a node's --http listener?)") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise Unreachable(
            f"cannot reach {base}: {reason} (is the node running, and is this its --http listener?)"
        ) from None
    return {"url": base, "status": health.get("status", "?"), "stats": stats}


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]


def _rate(now: int, before: int | None, seconds: float | None) -> str:
    if before is None or not seconds:
        return "-"
    return f"{max(now - before, 0) / seconds:.1f}"


def _link_messages(stats: dict[str, Any], link: dict[str, Any]) -> int:
    """Messages the node forwarded over (producer) or received on (consumer) ``link``'s peer node."""
    peer = (stats.get("traffic") or {}).get("peers", {}).get(link.get("peer_node") or "", {})
    return int(peer.get("forwarded" if link["role"] == "producer" else "received", 0))


def render(nodes: list[dict[str, Any]], previous: dict[Any, Any] | None = None, seconds: float | None = None) -> str:
    """The status table of ``nodes`` (from :func:`fetch`); ``previous``/``seconds``: the last frame, for rates."""
    before: dict[Any, Any] = {} if previous is None else previous
    asked = {n["stats"]["node"] for n in nodes}
    node_rows = []
    for n in nodes:
        s = n["stats"]
        fed, hub = s.get("federation", {}), s.get("hub", {})
        links = s.get("links", [])
        drops = sum((s.get("traffic") or {}).get("dropped", {}).values())
        replay = s.get("replay") or {}
        last = before.get(("node", s["node"]))
        node_rows.append(
            [
                s["node"],
                n["status"],
                n["url"],
                f"{sum(1 for link in links if link['state'] == 'open')}/{len(links)}",
                str(hub.get("published", 0)),
                str(hub.get("delivered", 0)),
                str(fed.get("forwarded", 0)),
                str(fed.get("received", 0)),
                _rate(fed.get("forwarded", 0), None if last is None else last[0], seconds),
                _rate(fed.get("received", 0), None if last is None else last[1], seconds),
                str(drops),
                str(fed.get("gaps", 0)),
                str(replay.get("kept_messages", "-")),
            ]
        )
    seen = sorted({link["peer_node"] for n in nodes for link in n["stats"].get("links", []) if link["peer_node"]})
    for peer in seen:
        if peer not in asked:
            via = sorted(
                n["stats"]["node"] for n in nodes if any(lk["peer_node"] == peer for lk in n["stats"]["links"])
            )
            node_rows.append([peer, "linked", f"(peer of {', '.join(via)})", *["-"] * 10])
    link_rows = []
    for n in nodes:
        s = n["stats"]
        peers = (s.get("traffic") or {}).get("peers", {})
        for link in s.get("links", []):
            peer = peers.get(link.get("peer_node") or "", {})
            messages = _link_messages(s, link)
            last = before.get(("link", s["node"], link["peer"], link["role"]))
            link_rows.append(
                [
                    s["node"],
                    link.get("peer_node") or "?",
                    link["peer"],
                    link["role"],
                    link["direction"],
                    link["state"],
                    link.get("version") or "-",
                    str(link.get("topics", 0)),
                    str(messages),
                    _rate(messages, last, seconds),
                    str(peer.get("dropped", 0)),
                    str(peer.get("gaps", 0)),
                    str(peer.get("lost", 0)),
                    str(peer.get("replayed", 0)),
                ]
            )
    lines = [f"pubsubclub status: {len(nodes)} node(s) asked, {len(node_rows)} known, {len(link_rows)} link(s)", ""]
    lines += _table(
        ["NODE", "STATE", "OPS", "LINKS", "PUBLISHED", "DELIVERED", "FORWARDED", "RECEIVED", "FWD/S", "RECV/S",
         "DROPPED", "GAPS", "REPLAY KEPT"],
        node_rows,
    )  # fmt: skip
    lines.append("")
    if link_rows:
        lines += _table(
            ["NODE", "PEER", "PEER ADDRESS", "ROLE", "DIR", "STATE", "VERSION", "TOPICS", "MESSAGES", "MSG/S",
             "DROPPED", "GAPS", "LOST", "REPLAYED"],
            link_rows,
        )  # fmt: skip
    else:
        lines.append("no links")
    return "\n".join(lines)


def _memory(nodes: list[dict[str, Any]]) -> dict[Any, Any]:
    """What the next frame needs for its rates."""
    kept: dict[Any, Any] = {}
    for n in nodes:
        s = n["stats"]
        fed = s.get("federation", {})
        kept[("node", s["node"])] = (fed.get("forwarded", 0), fed.get("received", 0))
        for link in s.get("links", []):
            kept[("link", s["node"], link["peer"], link["role"])] = _link_messages(s, link)
    return kept


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """``pubsubclub status``: 0 when every node answered, 1 when one did not."""
    urls = args.http or [DEFAULT_URL]
    if args.watch is not None and args.watch < 0:
        print("pubsubclub status: --watch needs a number of seconds >= 0", file=err)
        return 2
    frames = 1 if args.watch is None else args.count
    previous: dict[Any, Any] | None = None
    last_time: float | None = None
    frame = 0
    failed = False
    try:
        while frames is None or frame < frames:
            if frame:
                time.sleep(args.watch)
            frame += 1
            nodes, problems = [], []
            for url in urls:
                try:
                    nodes.append(fetch(url))
                except Unreachable as e:
                    problems.append(str(e))
            now = time.monotonic()
            failed = failed or bool(problems)
            if args.json:
                print(json.dumps({"nodes": nodes, "unreachable": problems}), file=out, flush=True)
            else:
                if args.watch is not None and out.isatty():
                    out.write("\x1b[H\x1b[2J")  # redraw in place
                elif frame > 1:
                    out.write("\n")
                if nodes:
                    seconds = None if last_time is None else now - last_time
                    out.write(render(nodes, previous, seconds) + "\n")
                out.flush()
                for problem in problems:
                    print(f"pubsubclub status: {problem}", file=err, flush=True)
            previous, last_time = _memory(nodes), now
    except KeyboardInterrupt:
        pass
    return 1 if failed else 0
