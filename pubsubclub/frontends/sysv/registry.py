"""The persisted registry of the System V front-end: its users, and its state as saved across restarts.

Split from :mod:`pubsubclub.frontends.sysv.service` (issue 19): the saved
state's shape (:func:`snapshot`) and how it is checked and loaded back
(:func:`restore`, which leaves out what breaks the limits). The service's
``snapshot``/``restore`` methods call these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pubsubclub.frontends.sysv.codec import MESSAGE_COUNT_BASE, MESSAGE_COUNT_MAX, SERVER_ID, channel_name, nick_name

if TYPE_CHECKING:
    from pubsubclub.frontends.sysv.service import SysVService

#: Version of the saved state file.
STATE_VERSION = 1


@dataclass(slots=True)
class _User:
    pid: int
    nick: bytes
    #: :func:`process_start` at login: tells a reused PID from this client.
    start: int


def snapshot(service: SysVService) -> dict[str, Any]:
    """The state that survives a restart, as JSON-ready data."""
    return {
        "version": STATE_VERSION,
        "count_mark": service._count_mark,
        "channels": list(service.channels),
        "users": [[u.pid, u.nick.hex(), u.start] for u in service.users.values()],
        "subscriptions": [
            [pid, c, n] for c, subscribers in service.subscriptions.items() for pid, n in subscribers.items()
        ],
        "blocks": [[blocker, blocked] for blocker, pids in service.blocks.items() for blocked in sorted(pids)],
    }


def restore(service: SysVService, state: dict[str, Any]) -> None:
    """Load a :func:`snapshot` (of this or an earlier run); what breaks the limits is left out.

    Raises ValueError for a state that is not a snapshot.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError("not a SysV state of version 1")
    mark = state.get("count_mark")
    if type(mark) is not int or not MESSAGE_COUNT_BASE <= mark <= MESSAGE_COUNT_MAX:
        raise ValueError("count_mark out of range")
    service._count = service._count_mark = mark
    for name in _rows(state, "channels", str):
        if len(service.channels) < service.limits.max_channels and channel_name(name.encode("utf-8", "replace")):
            service.channels[name] = None
    for pid, nick_hex, start in _rows(state, "users", list, (int, str, int)):
        nick = bytes.fromhex(nick_hex)
        if (
            len(service.users) < service.limits.max_users
            and pid > SERVER_ID
            and nick_name(nick) is not None
            and nick not in service._by_nick
        ):
            service._add_user(_User(pid, nick, start))
    for pid, channel, remaining in _rows(state, "subscriptions", list, (int, str, int)):
        if (
            pid in service.users
            and channel in service.channels
            and pid not in service.subscriptions.get(channel, ())
            and service._subscription_count < service.limits.max_subscriptions
        ):
            service._add_subscription(channel, pid, max(0, remaining))
    for blocker, blocked in _rows(state, "blocks", list, (int, int)):
        if (
            blocker in service.users
            and blocked in service.users
            and blocker != blocked
            and blocked not in service.blocks.get(blocker, ())
            and service._block_count < service.limits.max_blocks
        ):
            service.blocks.setdefault(blocker, set()).add(blocked)
            service._block_count += 1
    service.dirty = False


def _rows(state: dict[str, Any], key: str, kind: type, shape: tuple[type, ...] = ()) -> list[Any]:
    """The list ``state[key]`` with every row of type ``kind`` (and, for lists, of ``shape``)."""
    rows = state.get(key, [])
    if not isinstance(rows, list) or len(rows) > 10_000:
        raise ValueError(f"{key} is not a list of at most 10000 rows")
    for row in rows:
        ok = isinstance(row, kind)
        if ok and shape:
            ok = len(row) == len(shape) and all(type(v) is t for v, t in zip(row, shape, strict=True))
        if not ok:
            raise ValueError(f"bad row in {key}: {row!r:.80}")
    return rows
