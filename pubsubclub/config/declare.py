"""One declaration per setting: :func:`setting` (default, help, flag, bounds, choices) and :class:`Setting`.

A section is a frozen dataclass whose fields are declared with :func:`setting`.
From that one declaration come the TOML key, the command-line flag and its
``--help`` line, the docs table, the TOML type check and the value check
(:func:`check_value`: ``min``/``max``, ``choices`` and a per-value ``check``).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.endpoints import _parseServer  # type: ignore[attr-defined]

MiB = 1024 * 1024


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key {key!r}: {problem}")
        self.key = key


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    min: float | None = None,
    max: float | None = None,
    check: Callable[[str, Any], None] | None = None,
    shown_default: str | None = None,
    advanced: bool = False,
    aliases: tuple[str, ...] = (),
    toml_int: bool = False,
) -> Any:
    """Declare one setting: a dataclass field that also knows its flag, help text and valid values.

    ``flag`` defaults to ``--<section>-<key>`` (``--<key>`` at the top level).
    A boolean that defaults to true gets a ``--no-...`` flag. ``advanced``
    settings are left out of ``--help`` (they still have a flag and a key).
    ``min``/``max`` bound a number (inclusive), ``choices`` a string;
    ``check(key, value)`` raises :class:`ConfigError` for any other rule on
    the value alone (applied to each item of a list; None is "not set" and
    never checked). Rules between settings stay in ``NodeConfig.validate``.
    ``aliases`` are further TOML keys of the same section that set it (an
    earlier name); a list setting's key also takes a single string.
    ``toml_int``: a string setting that TOML may also give as an integer (``workers = 4``).
    """
    meta = {
        "help": help,
        "flag": flag,
        "metavar": metavar,
        "choices": choices,
        "min": min,
        "max": max,
        "check": check,
        "shown_default": shown_default,
        "advanced": advanced,
        "aliases": aliases,
        "toml_int": toml_int,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Setting:
    """One declared setting, as the CLI and the TOML loader see it."""

    section: str
    attr: str
    field: Field[Any]

    @property
    def key(self) -> str:
        """The TOML key inside its section (hyphenated)."""
        return self.attr.replace("_", "-")

    @property
    def id(self) -> str:
        """``section.key``, or ``key`` at the top level: how messages name it."""
        return f"{self.section}.{self.key}" if self.section else self.key

    @property
    def aliases(self) -> tuple[str, ...]:
        """Further TOML keys (hyphenated) of the same section that set this setting."""
        return tuple(self.field.metadata.get("aliases", ()))

    @property
    def default(self) -> Any:
        """The declared default."""
        return self.field.default if self.field.default is not MISSING else None

    @property
    def kind(self) -> str:
        """The declared type, as text."""
        return str(self.field.type)

    @property
    def flag(self) -> str:
        """The command-line flag."""
        declared = self.field.metadata.get("flag")
        if declared:
            return str(declared)
        base = f"{self.section}-{self.key}" if self.section else self.key
        return f"--no-{base}" if self.kind == "bool" and self.default is True else f"--{base}"

    @property
    def legacy_key(self) -> str:
        """The flat top-level TOML key of earlier versions (the flag without dashes or ``no-``).

        Value errors name a setting by it, as they always have.
        """
        name = self.flag.removeprefix("--")
        if self.kind == "bool" and self.default is True:
            name = name.removeprefix("no-")
        return name

    @property
    def dest(self) -> str:
        """The argparse destination."""
        return f"{self.section}__{self.attr}" if self.section else self.attr

    def help_text(self) -> str:
        """The ``--help`` line: the text and the default."""
        meta = self.field.metadata
        text = str(meta["help"])
        if self.kind == "bool":
            state = "on; this flag turns it off" if self.default else "off; this flag turns it on"
            return f"{text} (default: {state}; TOML: {self.toml_name()})"
        shown = meta.get("shown_default")
        if shown is None:
            shown = "none" if self.default in ((), None) else str(self.default)
        return f"{text} (default: {shown}; TOML: {self.toml_name()})"

    def toml_name(self) -> str:
        """Where it goes in the TOML file."""
        return f"[{self.section}] {self.key}" if self.section else self.key

    def check_value(self, value: Any) -> None:
        """Raise :class:`ConfigError` naming this setting when ``value`` breaks its declared bounds or rules."""
        if value is None:
            return
        meta = self.field.metadata
        key = self.legacy_key
        low, high = meta.get("min"), meta.get("max")
        if low is not None or high is not None:
            _check_number(key, value, self.kind.startswith("int"), low, high, meta.get("metavar") in ("S", "SECONDS"))
        choices = meta.get("choices")
        if choices and value not in choices:
            raise ConfigError(key, f"must be one of {', '.join(choices)}, not {value!r}")
        check = meta.get("check")
        if check is not None:
            for item in value if isinstance(value, tuple) else (value,):
                check(key, item)


def _check_number(key: str, value: Any, integer: bool, low: float | None, high: float | None, seconds: bool) -> None:
    """``value`` is an integer (or a number) within [low, high]; else the error says what is allowed."""
    if integer:
        ok_type, what = type(value) is int, "an integer"
    else:
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        what = "a number of seconds" if seconds else "a number"
    in_range = ok_type and (low is None or value >= low) and (high is None or value <= high)
    if in_range:
        return
    if low is not None and high is not None:
        bounds = f" between {low:g} and {high:g}" if not integer else f" between {int(low)} and {int(high)}"
    elif low is not None:
        bounds = f" of at least {low:g}"
    else:
        bounds = f" of at most {high:g}"
    raise ConfigError(key, f"must be {what}{bounds}")


# -- per-value checks (``setting(check=...)``) -------------------------------------------


def check_endpoint(key: str, value: Any) -> None:
    """A Twisted server endpoint string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "must be a Twisted endpoint string such as tcp:8080:interface=127.0.0.1")
    try:
        _parseServer(value, None)
    except Exception as e:  # Twisted raises assorted errors for bad strings.
        raise ConfigError(key, f"bad endpoint {value!r}: {e}") from None


def check_prefix(key: str, value: Any) -> None:
    """A hub topic prefix: short, printable, no spaces, never reaching the reserved ``$`` topics."""
    if (
        not isinstance(value, str)
        or len(value) > 128
        or value.startswith("$")
        or not value.isprintable()
        or " " in value
    ):
        raise ConfigError(key, "must be at most 128 printable characters, no spaces, not starting with $")


def check_http_url(key: str, value: Any) -> None:
    """An http:// or https:// URL with a host."""
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(key, f"must be an http:// or https:// URL, not {value!r}")


def check_ws_url(key: str, value: Any) -> None:
    """A ws:// or wss:// URL with a host and a port."""
    if not isinstance(value, str):
        raise ConfigError(key, "must be a ws:// or wss:// URL")
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(key, f"bad port in {value!r}") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname or port is None:
        raise ConfigError(key, f"must be a ws://host:port/path URL, not {value!r}")


def check_uri(key: str, value: Any) -> None:
    """A WAMP URI or name: 1-255 printable characters, no spaces."""
    if not isinstance(value, str) or not value or len(value) > 255 or not value.isprintable() or " " in value:
        raise ConfigError(key, "must be a WAMP URI or name: 1-255 printable characters, no spaces")


def check_realm(key: str, value: Any) -> None:
    """A WAMP realm name: 1-255 printable characters, no whitespace, no ``#`` (it ends ``$realm.<realm>#``)."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= 255
        or not value.isprintable()
        or any(c.isspace() for c in value)
        or "#" in value
    ):
        raise ConfigError(key, f"must be a realm name: 1-255 printable characters without spaces or '#', not {value!r}")


def check_text(low: int, high: int, *, spaces: bool = True) -> Callable[[str, Any], None]:
    """A check: a string of ``low``..``high`` characters (without whitespace unless ``spaces``)."""

    def check(key: str, value: Any) -> None:
        if (
            not isinstance(value, str)
            or not low <= len(value) <= high
            or (not spaces and any(c.isspace() for c in value))
        ):
            raise ConfigError(key, f"must be {low}-{high} characters" + ("" if spaces else " without spaces"))

    return check


#: Most worker processes one node may run (``workers``).
MAX_WORKERS = 256


def check_workers(key: str, value: Any) -> None:
    """``workers``: ``auto`` or a whole number from 1 to :data:`MAX_WORKERS`."""
    if value == "auto":
        return
    if not isinstance(value, str) or not value.isdigit() or not 1 <= int(value) <= MAX_WORKERS:
        raise ConfigError(key, f"must be auto or a whole number from 1 to {MAX_WORKERS}")


def workers_count(value: str) -> int:
    """How many workers ``workers`` asks for (``auto``: the host's cores, at most :data:`MAX_WORKERS`)."""
    if value == "auto":
        return max(1, min(os.cpu_count() or 1, MAX_WORKERS))
    return int(value)


def check_sysv_key(key: str, value: Any) -> None:
    """A SysV queue key: an integer literal (``0x420``), positive, 32 bits, never IPC_PRIVATE."""
    try:
        number = int(value, 0)
    except (TypeError, ValueError):
        raise ConfigError(key, f"must be an integer key such as 0x420, not {value!r}") from None
    if not 1 <= number <= 0x7FFFFFFF:
        raise ConfigError(key, "must be a positive 32-bit key (IPC_PRIVATE, 0, is not allowed)")


def binds_beyond_loopback(endpoint: str) -> bool:
    """Whether a TCP/TLS listener endpoint accepts connections from beyond this host (no interface: it does)."""
    try:
        kind, _args, kwargs = _parseServer(endpoint, None)
    except Exception:  # validation reports bad strings; nothing to warn about here
        return False
    name = kind if isinstance(kind, str) else type(kind).__name__
    if name not in ("TCP", "SSL", "_TCP6ServerParser"):
        return False  # UNIX sockets, systemd-passed sockets, plugins: not ours to judge
    interface = str(kwargs.get("interface", "")).strip("[]").split("%")[0]
    if interface == "localhost":
        return False
    try:
        return not ipaddress.ip_address(interface).is_loopback
    except ValueError:  # "" (every address) or a name
        return True
