"""``pubsubclub bench --scenario idle``: node memory per idle WAMP session.

One node is started; a lean client opens ``--sessions`` WebSocket connections
(a minimal RFC 6455 client on asyncio: the upgrade, one masked text frame
with HELLO, the WELCOME read back, then one SUBSCRIBE to a topic all share
and its SUBSCRIBED) and keeps them open, idle. With ``--transport
rawsocket`` the sessions are WAMP RawSocket ones instead (the node's
``--rawsocket`` listener; the 4-octet handshake for JSON, then the same
HELLO and SUBSCRIBE, each one frame). The node's RSS
(``/proc/<pid>/status``) is read before the first connection and after the
last SUBSCRIBED; the difference divided by the count is the cost of one idle
subscribed session (its TCP connection, WebSocket protocol, broker session
and subscription). ``make bench-peers`` measures the same against one
Crossbar router (the RSS of its whole process tree).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import struct
import time
from typing import Any

from pubsubclub.bench.nodes import free_port, local, machine, progress, start_node, stats, stop, tree_rss

HELLO = json.dumps([1, "realm1", {"roles": {"subscriber": {}}}]).encode()
#: The topic every idle session subscribes to.
IDLE_TOPIC = "pubsubclub.bench.idle"


def frame(payload: bytes) -> bytes:
    """One masked text frame (a client must mask)."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    header = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0x80 | 126]) + struct.pack("!H", n)
    return header + mask + masked


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The payload of the next (unmasked, server-sent) WebSocket frame."""
    head = await reader.readexactly(2)
    length = head[1] & 0x7F
    if length == 126:
        length = struct.unpack("!H", await reader.readexactly(2))[0]
    elif length == 127:
        length = struct.unpack("!Q", await reader.readexactly(8))[0]
    return await reader.readexactly(length)


async def joined_session(port: int, hello: bytes = HELLO) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WAMP session over a minimal WebSocket client: the upgrade, HELLO, WELCOME read back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: wamp.2.json\r\n\r\n"
        ).encode()
    )
    await reader.readuntil(b"\r\n\r\n")
    writer.write(frame(hello))
    welcome = json.loads(await read_frame(reader))
    if welcome[0] != 2:
        raise RuntimeError(f"no WELCOME: {welcome!r}")
    return reader, writer


#: The RawSocket handshake of a client taking messages up to 16 MiB (LENGTH 15), serializer 1 (JSON).
RAWSOCKET_HELLO = bytes([0x7F, 0xF1, 0, 0])


def rawsocket_frame(payload: bytes) -> bytes:
    """One RawSocket WAMP message frame (type 0, 24-bit length)."""
    return struct.pack("!I", len(payload)) + payload


async def read_rawsocket_message(reader: asyncio.StreamReader) -> bytes:
    """The payload of the next RawSocket WAMP message frame (a PING the node sends meanwhile is skipped)."""
    while True:
        (header,) = struct.unpack("!I", await reader.readexactly(4))
        payload = await reader.readexactly(header & 0xFFFFFF)
        if header >> 24 == 0:
            return payload


async def joined_rawsocket_session(
    port: int, hello: bytes = HELLO
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WAMP session over a minimal RawSocket client: the handshake (JSON), HELLO, WELCOME read back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(RAWSOCKET_HELLO)
    answer = await reader.readexactly(4)
    if answer[0] != 0x7F or answer[1] & 0x0F != 1:
        raise RuntimeError(f"RawSocket handshake refused: {answer!r}")
    writer.write(rawsocket_frame(hello))
    welcome = json.loads(await read_rawsocket_message(reader))
    if welcome[0] != 2:
        raise RuntimeError(f"no WELCOME: {welcome!r}")
    return reader, writer


async def _session(port: int, transport: str = "websocket") -> asyncio.StreamWriter:
    subscribe = json.dumps([32, 1, {}, IDLE_TOPIC]).encode()
    if transport == "rawsocket":
        reader, writer = await joined_rawsocket_session(port)
        writer.write(rawsocket_frame(subscribe))
        answer = await read_rawsocket_message(reader)
    else:
        reader, writer = await joined_session(port)
        writer.write(frame(subscribe))
        answer = await read_frame(reader)
    if not answer.startswith(b"[33,"):
        raise RuntimeError(f"no SUBSCRIBED: {answer[:80]!r}")
    return writer


async def _open_all(port: int, count: int, deadline: float, transport: str) -> list[asyncio.StreamWriter]:
    writers: list[asyncio.StreamWriter] = []
    batch = 200
    while len(writers) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(writers)} of {count} sessions before the time bound")
        n = min(batch, count - len(writers))
        writers.extend(await asyncio.gather(*(_session(port, transport) for _ in range(n))))
        if len(writers) % 2000 == 0:
            progress(f"{len(writers)} sessions open")
    return writers


def run_idle_bench(args: argparse.Namespace) -> int:
    """Start a node, open the sessions, print the memory per session."""
    count = args.sessions
    transport = args.transport or "websocket"
    if args.serializer != "json":
        raise SystemExit(f"pubsubclub: error: --scenario idle: the idle client speaks JSON, not {args.serializer}")
    progress(
        f"settings: --scenario idle --sessions {count} --transport {transport} --max-seconds {args.max_seconds:g}"
        " (defaults: 10000, websocket, 60)"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, count * 2 + 1024)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # the node inherits it
    if want < count + 256:
        raise SystemExit(f"pubsubclub: error: the open-file limit ({hard}) is too low for {count} sessions")
    port, ops_port = free_port(), free_port()
    # RawSocket: the sessions' listener beside an unused WebSocket one (the node always has one).
    listeners = ["--wamp", local(port)]
    if transport == "rawsocket":
        listeners = ["--wamp", local(0), "--rawsocket", local(port)]
    node, _ = start_node(
        "bench-idle", [*listeners, "--psc", local(0), "--http", local(ops_port), *idle_node_flags(count)]
    )
    try:
        figures = measure_idle(port, [node.pid], count, args.max_seconds, transport)
        # The node's cyclic-GC full collections while the sessions joined (docs/architecture.md, "Closed
        # connections and the cyclic collector"): how long the longest stalled its reactor.
        figures["gc"] = stats(f"http://127.0.0.1:{ops_port}/")["gc"]
    finally:
        stop([node])
    results = {"machine": machine(), "scenario": "idle", **figures}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"{count} idle subscribed WAMP sessions ({transport}): node RSS {figures['rss_before'] / 2**20:.1f} -> "
            f"{figures['rss_after'] / 2**20:.1f} MiB, {figures['bytes_per_session'] / 1024:.1f} KiB per session "
            f"(opened in {figures['open_seconds']:.1f} s)"
        )
        gc_figures = figures["gc"]
        print(
            f"full GC collections in the node while they joined: {gc_figures['full_collections']}, longest "
            f"{gc_figures['max_full_ms']:.1f} ms; {gc_figures['frozen']} objects frozen"
        )
    return 0


def idle_node_flags(count: int, workers: int = 1) -> list[str]:
    """A node's flags for ``count`` idle sessions from one address, on a node of ``workers`` workers.

    One address holds every session, and the lean client never answers pings: the connection
    layer's caps go up to the count and its idle deadline is off (docs/security.md). The caps are
    the node's, shared out over its workers, and SO_REUSEPORT does not spread connections evenly:
    every worker's share holds them all.
    """
    cap = str((count + 64) * workers)
    return ["--edge-max-per-address", cap, "--edge-max-connections", cap, "--edge-idle-timeout", "0"]


def measure_idle(
    port: int, pids: list[int], count: int, max_seconds: float, transport: str = "websocket"
) -> dict[str, Any]:
    """Open ``count`` idle subscribed ``transport`` sessions on ``port``; the RSS of ``pids`` (and children) around."""
    before = tree_rss(pids)
    loop = asyncio.new_event_loop()
    writers: list[Any] = []
    try:
        started = time.perf_counter()
        writers = loop.run_until_complete(_open_all(port, count, time.monotonic() + max_seconds, transport))
        opened = time.perf_counter() - started
        after = tree_rss(pids)
    finally:
        for writer in writers:
            writer.transport.abort()
        loop.close()
    return {
        "sessions": count,
        "transport": transport,
        "subscribed": len(writers),  # each one's SUBSCRIBED read back
        "rss_before": before,
        "rss_after": after,
        "bytes_per_session": (after - before) / count,
        "open_seconds": opened,
    }
