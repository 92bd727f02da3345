"""Node configuration: one dataclass, loaded from TOML and flags, validated once."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.endpoints import _parseServer  # type: ignore[attr-defined]


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key {key!r}: {problem}")
        self.key = key


LISTEN_ROLES = ("producer", "consumer")


@dataclass(frozen=True)
class NodeConfig:
    """Everything ``pubsubclub node`` needs."""

    #: Node id: unique in the cluster; also the name in logs and metrics.
    name: str | None = None
    #: Twisted endpoint of the WAMP listener (WebSocket at ``/ws``, chat page at ``/``).
    wamp: str = "tcp:8080:interface=127.0.0.1"
    #: WAMP realm served.
    realm: str = "realm1"
    #: Twisted endpoint of the federation listener (``/psc``); None: do not listen.
    psc: str | None = "tcp:9001:interface=127.0.0.1"
    #: PSC URLs of the other nodes (static discovery).
    peer: tuple[str, ...] = ()
    #: Which role listens, cluster-wide: ``producer`` (default) or ``consumer``.
    listen_role: str = "producer"
    #: The PSC URL other nodes dial to reach this node (to recognise itself in peer lists).
    advertise: str | None = None
    #: Largest WAMP or PSC message accepted, in bytes.
    max_message_size: int = 1024 * 1024
    #: Serve the browser chat page at ``/`` of the WAMP listener.
    chat_page: bool = True
    #: Twisted endpoint of the operations listener (``/health``); None: off.
    http: str | None = None
    #: Consul agent URL (``http://127.0.0.1:8500``); None: static discovery only.
    consul: str | None = None
    #: Consul service name the nodes register under and watch.
    service: str = "pubsubclub"
    #: Consul ACL token.
    consul_token: str | None = None
    #: Consul datacenter.
    consul_dc: str | None = None
    #: File holding the cluster secret; links must prove it (HMAC) when set.
    cluster_secret_file: str | None = None
    #: CA certificates (PEM) that ``wss://`` peers are verified against.
    ca_file: str | None = None
    #: Extra fields kept for later front-ends.
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> NodeConfig:
        """Return self, or raise :class:`ConfigError` naming the first bad key."""
        if self.name is not None and (not self.name or len(self.name) > 128 or any(c.isspace() for c in self.name)):
            raise ConfigError("name", "must be 1-128 characters without spaces")
        _check_endpoint("wamp", self.wamp)
        if self.psc is not None:
            _check_endpoint("psc", self.psc)
        if not self.realm or len(self.realm) > 255:
            raise ConfigError("realm", "must be a non-empty WAMP URI")
        for url in self.peer:
            _check_url("peer", url)
        if self.advertise is not None:
            _check_url("advertise", self.advertise)
        if self.listen_role not in LISTEN_ROLES:
            raise ConfigError("listen-role", f"must be one of {', '.join(LISTEN_ROLES)}, not {self.listen_role!r}")
        if self.http is not None:
            _check_endpoint("http", self.http)
        if self.consul is not None:
            _check_http_url("consul", self.consul)
        if not self.service or len(self.service) > 128:
            raise ConfigError("service", "must be 1-128 characters")
        for key in ("cluster_secret_file", "ca_file"):
            path = getattr(self, key)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(key.replace("_", "-"), f"no such file: {path}")
        if not isinstance(self.max_message_size, int) or not 1024 <= self.max_message_size <= 64 * 1024 * 1024:
            raise ConfigError("max-message-size", "must be an integer between 1024 and 67108864")
        return self


def _check_endpoint(key: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "must be a Twisted endpoint string such as tcp:8080:interface=127.0.0.1")
    try:
        _parseServer(value, None)
    except Exception as e:  # Twisted raises assorted errors for bad strings.
        raise ConfigError(key, f"bad endpoint {value!r}: {e}") from None


def _check_http_url(key: str, value: Any) -> None:
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(key, f"must be an http:// or https:// URL, not {value!r}")


def _check_url(key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise ConfigError(key, "must be a ws:// or wss:// URL")
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
        raise ConfigError(key, f"bad port in {value!r}") from None
    if parts.scheme not in ("ws", "wss") or not parts.hostname or port is None:
        raise ConfigError(key, f"must be a ws://host:port/path URL, not {value!r}")


def _key(name: str) -> str:
    return name.replace("-", "_")


_FIELDS = {f.name for f in fields(NodeConfig)} - {"extra"}


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML config file into NodeConfig keyword arguments."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from None
    values: dict[str, Any] = {}
    for name, value in raw.items():
        key = _key(name)
        if key == "peers":
            key = "peer"
        if key not in _FIELDS:
            raise ConfigError(name, f"unknown key in {path}")
        if key == "peer":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(name, "must be a list of URLs")
            value = tuple(value)
        elif key not in ("peer", "chat_page", "max_message_size") and not isinstance(value, str):
            raise ConfigError(name, "must be a string")
        elif key == "max_message_size" and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(name, "must be an integer")
        elif key == "chat_page" and not isinstance(value, bool):
            raise ConfigError(name, "must be true or false")
        values[key] = value
    return values


def build(file_values: dict[str, Any], flag_values: dict[str, Any]) -> NodeConfig:
    """Flags override the file; the result is validated."""
    merged = {**file_values, **{k: v for k, v in flag_values.items() if v is not None}}
    return replace(NodeConfig(), **merged).validate()
