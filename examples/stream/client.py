#!/usr/bin/env python3
"""A small client of a pubsubclub node's stream front-end (docs/stream.md): publish, subscribe, commit.

Start a node with a stream listener, e.g.
``pubsubclub node --stream tcp:7878:interface=127.0.0.1 --data-dir data``, then::

    examples/stream/client.py publish orders "first order" "second order"
    examples/stream/client.py subscribe orders --from earliest --count 2
    examples/stream/client.py subscribe orders --from 1               # from sequence 1 on, until Ctrl-C
    examples/stream/client.py subscribe orders --from current --group billing --commit --count 1
    examples/stream/client.py commit orders 41 --group billing        # next --from current starts at 42

Output, one line per event so scripts can read it: ``published TOPIC`` per
acknowledged message (durable in the node's log), ``SEQUENCE<TAB>PAYLOAD`` per
message received (payload as UTF-8; newlines, backslashes and undecodable
bytes escaped with a backslash), ``committed
TOPIC OFFSET`` per commit. A node's ERROR answer is printed on stderr as
``error CODE MESSAGE`` and the client exits 1; bad arguments exit 2.

Standard library only; copy it and change what you need. The wire: a JSON
header (one object; the reader finds its end by counting brackets outside
strings, there is no separator), followed for Publish and Message by exactly
``payload_size`` bytes whose sha1 is ``checksum``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import socket
import sys
from typing import Any

#: Longest header this client reads (the node's default limit for its own input is 64 KiB).
MAX_HEADER_BYTES = 64 * 1024


class NodeError(Exception):
    """The node answered ERROR (code and message), or the connection broke."""


class Connection:
    """One connection to the stream listener: writes requests, reads the node's frames in order."""

    def __init__(self, host: str, port: int, timeout: float, group: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""
        self.send({"Connect": {"client_name": "examples/stream/client.py", "group_id": group}})
        self.expect_ok()

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """One request: its JSON header, then the payload if any."""
        self.sock.sendall(json.dumps(header).encode() + payload)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise NodeError("the node closed the connection")
        self.buffer += data

    def _header_end(self) -> int | None:
        """Index just past the first complete JSON object in the buffer (None: not all here yet)."""
        depth, in_string, escaped = 0, False, False
        for i, byte in enumerate(self.buffer):
            if in_string:
                if escaped:
                    escaped = False
                elif byte == 0x5C:  # backslash
                    escaped = True
                elif byte == 0x22:  # closing quote
                    in_string = False
            elif byte == 0x22:
                in_string = True
            elif byte == 0x7B:  # {
                depth += 1
            elif byte == 0x7D:  # }
                depth -= 1
                if depth == 0:
                    return i + 1
        return None

    def read(self) -> tuple[str, dict[str, Any], bytes]:
        """The next frame: its kind (Status, Message, CommitAck), its fields, and its payload."""
        while True:
            self.buffer = self.buffer.lstrip()
            end = self._header_end()
            if end is not None:
                break
            if len(self.buffer) > MAX_HEADER_BYTES:
                raise NodeError("the node sent a header longer than 64 KiB")
            self._fill()
        frame = json.loads(self.buffer[:end])
        self.buffer = self.buffer[end:]
        [(kind, fields)] = frame.items()
        payload = b""
        if kind == "Message":
            size = fields["payload_size"]
            while len(self.buffer) < size:
                self._fill()
            payload, self.buffer = self.buffer[:size], self.buffer[size:]
            if hashlib.sha1(payload).hexdigest() != fields["checksum"]:
                raise NodeError(f"message {fields['sequence']} does not match its checksum")
        elif kind == "Status" and fields.get("status") != "OK":
            raise NodeError(f"{fields.get('code')} {fields.get('message')}")
        return kind, fields, payload

    def expect_ok(self) -> dict[str, Any]:
        """Read up to the next answer, which must be an OK Status (Message frames before it are not expected)."""
        kind, fields, _ = self.read()
        if kind != "Status":
            raise NodeError(f"expected a Status answer, got {kind}")
        return fields

    def close(self) -> None:
        """Ask the node to finish what it owes and close."""
        try:
            self.send({"status": "CLOSE"})
        finally:
            self.sock.close()


def publish(conn: Connection, topic: str, messages: list[str]) -> None:
    """Publish each message and print ``published TOPIC`` once the node has it durable."""
    for text in messages:
        payload = text.encode()
        conn.send(
            {"Publish": {"topic": topic, "payload_size": len(payload), "checksum": hashlib.sha1(payload).hexdigest()}},
            payload,
        )
        conn.expect_ok()
        print(f"published {topic}", flush=True)


def position(value: str) -> dict[str, Any]:
    """The Subscribe fields of ``--from``: earliest, latest, current, or a sequence number."""
    named = {"earliest": "Earliest", "latest": "Latest", "current": "Current"}
    if value.lower() in named:
        return {"position": named[value.lower()]}
    if value.isdigit():
        return {"position": "Offset", "offset": int(value)}
    raise argparse.ArgumentTypeError(f"{value!r}: use earliest, latest, current or a sequence number")


def subscribe(conn: Connection, topic: str, where: dict[str, Any], count: int | None, commit: bool) -> None:
    """Print each message of ``topic`` from ``where`` (``count`` of them, or until Ctrl-C); commit each if asked."""
    conn.send({"Subscribe": {"topic": topic, **where}})
    conn.expect_ok()
    conn.sock.settimeout(None)  # messages come when they come
    received = acks_owed = 0
    while count is None or received < count or acks_owed:
        kind, fields, payload = conn.read()
        if kind == "CommitAck":
            acks_owed -= 1
            continue
        if kind != "Message" or fields["topic"] != topic:
            continue
        if count is not None and received >= count:
            continue  # already printed what was asked for; waiting for commit acks only
        received += 1
        text = payload.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").decode("utf-8", "backslashreplace")
        print(f"{fields['sequence']}\t{text}", flush=True)
        if commit:
            conn.send({"Commit": {"topic": topic, "partition": 0, "commit_offset": fields["sequence"]}})
            acks_owed += 1


def commit(conn: Connection, topic: str, offset: int) -> None:
    """Record ``offset`` as the group's last processed message of ``topic``."""
    conn.send({"Commit": {"topic": topic, "partition": 0, "commit_offset": offset}})
    kind, fields, _ = conn.read()
    if kind != "CommitAck":
        raise NodeError(f"expected CommitAck, got {kind}")
    print(f"committed {fields['topic']} {fields['offset']}", flush=True)


def address(value: str) -> tuple[str, int]:
    """``HOST:PORT`` of ``--server``."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:7878")
    return host.strip("[]") or "127.0.0.1", int(port)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    top = argparse.ArgumentParser(
        prog="client.py",
        description="Publish to, subscribe to and commit offsets on a pubsubclub node's stream listener.",
    )
    top.add_argument(
        "--server", type=address, default=("127.0.0.1", 7878), help="the node's --stream address (127.0.0.1:7878)"
    )
    top.add_argument("--group", default="examples", help="group id; committed offsets are kept per group and topic")
    top.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for an answer (default 10)")
    commands = top.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="publish messages, each acknowledged once durable")
    pub.add_argument("topic")
    pub.add_argument("messages", nargs="+", help="one message per argument")
    sub = commands.add_parser("subscribe", help="print messages from a position")
    sub.add_argument("topic")
    sub.add_argument(
        "--from", dest="where", type=position, default={"position": "Latest"},
        help="earliest, latest (default), current (after the group's commit) or a sequence number",
    )  # fmt: skip
    sub.add_argument("--count", type=int, help="stop after this many messages (default: run until Ctrl-C)")
    sub.add_argument("--commit", action="store_true", help="commit each message's sequence after printing it")
    com = commands.add_parser("commit", help="record the group's last processed sequence of a topic")
    com.add_argument("topic")
    com.add_argument("offset", type=int)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one command; 0 on success, 1 when the node refused or went away."""
    args = parser().parse_args(argv)
    host, port = args.server
    try:
        conn = Connection(host, port, args.timeout, args.group)
    except OSError as e:
        print(f"error cannot reach the stream listener at {host}:{port} (is the node running with --stream?): {e}",
              file=sys.stderr)  # fmt: skip
        return 1
    except NodeError as e:
        print(f"error {e}", file=sys.stderr)
        return 1
    try:
        if args.command == "publish":
            publish(conn, args.topic, args.messages)
        elif args.command == "subscribe":
            subscribe(conn, args.topic, args.where, args.count, args.commit)
        else:
            commit(conn, args.topic, args.offset)
    except (NodeError, OSError) as e:
        print(f"error {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(OSError):
            conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
