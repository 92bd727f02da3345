"""Node configuration: one dataclass, loaded from TOML and flags, validated once."""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from twisted.internet.endpoints import _parseServer  # type: ignore[attr-defined]

if TYPE_CHECKING:
    from pubsubclub.wamp.auth import AuthPolicy


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key {key!r}: {problem}")
        self.key = key


LISTEN_ROLES = ("producer", "consumer")
CONSUL_CHECKS = ("ttl", "http")


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
    #: Consul health check: ``ttl`` (the node heartbeats) or ``http`` (the agent polls ``/health``).
    consul_check: str = "ttl"
    #: Seconds the TTL check lives without a heartbeat (heartbeats and HTTP polls every ttl/3).
    consul_ttl: float = 10.0
    #: Seconds of quiet before a membership change is applied to the links.
    consul_debounce: float = 0.5
    #: File holding the cluster secret; links must prove it (HMAC) when set.
    cluster_secret_file: str | None = None
    #: CA certificates (PEM) that ``wss://`` peers are verified against.
    ca_file: str | None = None
    #: Folder for metrics dumps (docs/metrics.md); None: no dumps.
    metrics_dir: str | None = None
    #: Seconds between metrics dumps.
    metrics_interval: float = 10.0
    #: Twisted endpoint of the NSD listener (TCP, JSON lines); None: off.
    nsd: str | None = None
    #: Folder for the node's stores (SQLite files).
    data_dir: str = "pubsubclub-data"
    #: Hub topic of NSD channel ``c`` is ``nsd_prefix + c``.
    nsd_prefix: str = ""
    #: Largest NSD message, in characters of its JSON text.
    nsd_max_message_chars: int = 65_536
    #: NSD history kept per channel (0: unlimited).
    nsd_retention_count: int = 10_000
    #: NSD history kept, in seconds (0: unlimited).
    nsd_retention_seconds: float = 0.0
    #: Twisted endpoint of the TEP listener (WebSocket at ``/tep``); None: off.
    tep: str | None = None
    #: Hub topic of TEP channel ``c`` is ``tep_prefix + c``.
    tep_prefix: str = ""
    #: TEP clients may publish to channels (else they get an ``#error`` frame).
    tep_client_publish: bool = True
    #: Channels one TEP client may join at once.
    tep_max_channels: int = 100
    #: PSC 0.3 replay buffer kept per consumer node, in bytes.
    replay_buffer_bytes: int = 16 * 1024 * 1024
    #: Seconds a dropped link can come back without loss (PSC 0.3); 0 turns the extension off.
    replay_window_seconds: float = 60.0
    #: TOML file of WAMP principals and roles (docs/security.md); None: everyone anonymous, all allowed.
    auth: str | None = None
    #: Bytes a WAMP or TEP client may leave unread before it is dropped as a slow consumer.
    max_send_buffer: int = 16 * 1024 * 1024
    #: Bytes queued for one peer's PSC link before the link is dropped (its replay buffer is apart).
    max_link_queue: int = 16 * 1024 * 1024
    #: Tell peers whom this node dials and dial whom they know, so one ``peer`` joins a whole cluster
    #: (off with ``consul``: Consul's health-checked list is the membership then).
    learn_peers: bool = True
    #: Deepest nesting of arrays/objects accepted from any client or peer (docs/security.md).
    max_json_depth: int = 64
    #: Seconds an NSD ``when`` or stamp from another node may be ahead of this node's clock.
    nsd_max_clock_skew: float = 3600.0
    #: Topics with series of their own in ``/metrics`` (the busiest); the rest are summed as ``__other__``.
    metrics_max_topics: int = 200
    #: File holding the bearer token of the TEP operator API (``/tep`` on ``http``); None: the API is off.
    tep_ops_token_file: str | None = None
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
        if self.consul_check not in CONSUL_CHECKS:
            raise ConfigError("consul-check", f"must be one of {', '.join(CONSUL_CHECKS)}, not {self.consul_check!r}")
        if self.consul is not None and self.consul_check == "http" and self.http is None:
            raise ConfigError("consul-check", "http needs --http (the agent polls its /health)")
        if not isinstance(self.consul_ttl, (int, float)) or not 0.3 <= self.consul_ttl <= 86400:
            raise ConfigError("consul-ttl", "must be a number of seconds between 0.3 and 86400")
        if not isinstance(self.consul_debounce, (int, float)) or not 0 <= self.consul_debounce <= 60:
            raise ConfigError("consul-debounce", "must be a number of seconds between 0 and 60")
        if not self.service or len(self.service) > 128:
            raise ConfigError("service", "must be 1-128 characters")
        for key in ("cluster_secret_file", "ca_file", "tep_ops_token_file"):
            path = getattr(self, key)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(key.replace("_", "-"), f"no such file: {path}")
        self.cluster_secret()
        self.tep_ops_token()
        self.trust_root()
        if type(self.metrics_max_topics) is not int or not 1 <= self.metrics_max_topics <= 100_000:
            raise ConfigError("metrics-max-topics", "must be an integer between 1 and 100000")
        if self.nsd is not None:
            _check_endpoint("nsd", self.nsd)
        if not 0.05 <= self.metrics_interval <= 86_400:
            raise ConfigError("metrics-interval", "must be between 0.05 and 86400 seconds")
        if not self.data_dir:
            raise ConfigError("data-dir", "must be a folder path")
        if not isinstance(self.nsd_max_message_chars, int) or self.nsd_max_message_chars < 1:
            raise ConfigError("nsd-max-message-chars", "must be a positive integer")
        if self.nsd_retention_count < 0 or self.nsd_retention_seconds < 0:
            raise ConfigError(
                "nsd-retention-count" if self.nsd_retention_count < 0 else "nsd-retention-seconds",
                "must not be negative",
            )
        if self.tep is not None:
            _check_endpoint("tep", self.tep)
        if (
            not isinstance(self.tep_prefix, str)
            or len(self.tep_prefix) > 128
            or self.tep_prefix.startswith("$")
            or not self.tep_prefix.isprintable()
            or " " in self.tep_prefix
        ):
            raise ConfigError("tep-prefix", "must be at most 128 printable characters, no spaces, not starting with $")
        if not isinstance(self.tep_max_channels, int) or not 1 <= self.tep_max_channels <= 100_000:
            raise ConfigError("tep-max-channels", "must be an integer between 1 and 100000")
        if not isinstance(self.max_message_size, int) or not 1024 <= self.max_message_size <= 64 * 1024 * 1024:
            raise ConfigError("max-message-size", "must be an integer between 1024 and 67108864")
        if (
            not isinstance(self.replay_buffer_bytes, int)
            or isinstance(self.replay_buffer_bytes, bool)
            or not 65_536 <= self.replay_buffer_bytes <= 2**40
        ):
            raise ConfigError("replay-buffer-bytes", "must be an integer between 65536 and 1099511627776")
        if (
            not isinstance(self.replay_window_seconds, (int, float))
            or isinstance(self.replay_window_seconds, bool)
            or not 0 <= self.replay_window_seconds <= 86_400
        ):
            raise ConfigError("replay-window-seconds", "must be a number of seconds between 0 (off) and 86400")
        for key in ("max_send_buffer", "max_link_queue"):
            value = getattr(self, key)
            if type(value) is not int or not 65_536 <= value <= 2**40:
                raise ConfigError(key.replace("_", "-"), "must be an integer between 65536 and 1099511627776")
        self.auth_policy()
        if type(self.max_json_depth) is not int or not 2 <= self.max_json_depth <= 200:
            raise ConfigError("max-json-depth", "must be an integer between 2 and 200")
        if not isinstance(self.nsd_max_clock_skew, (int, float)) or not 1 <= self.nsd_max_clock_skew <= 366 * 86400:
            raise ConfigError("nsd-max-clock-skew", "must be a number of seconds between 1 and 31622400")
        return self

    def auth_policy(self) -> AuthPolicy | None:
        """The :class:`~pubsubclub.wamp.auth.AuthPolicy` of ``auth``, or None; ConfigError naming the line."""
        if self.auth is None:
            return None
        from pubsubclub.wamp.auth import AuthFileError, load_auth

        try:
            return load_auth(self.auth)
        except AuthFileError as e:
            where = self.auth if e.line is None else f"{self.auth} line {e.line}"
            raise ConfigError("auth", f"{where}: {e.problem}") from None

    def cluster_secret(self) -> bytes | None:
        """The cluster secret (file contents without the trailing line break), or None."""
        if self.cluster_secret_file is None:
            return None
        return read_cluster_secret(self.cluster_secret_file)

    def tep_ops_token(self) -> bytes | None:
        """The TEP operator API's bearer token (file contents without the trailing line break), or None."""
        if self.tep_ops_token_file is None:
            return None
        return read_cluster_secret(self.tep_ops_token_file, key="tep-ops-token-file")

    def trust_root(self) -> Any:
        """The CAs of ``ca_file`` as a Twisted trust root, or None (the platform's CAs)."""
        if self.ca_file is None:
            return None
        from pubsubclub.federation.tls import load_trust_root

        try:
            return load_trust_root(self.ca_file)
        except OSError as e:
            raise ConfigError("ca-file", f"cannot read {self.ca_file}: {e.strerror}") from None
        except ValueError:
            raise ConfigError("ca-file", f"{self.ca_file} holds no PEM certificate") from None

    def public_listeners(self) -> list[str]:
        """Keys of the TCP/TLS listeners not bound to a loopback address (no interface: every address)."""
        public = []
        for key in _LISTENER_KEYS:
            value = getattr(self, key, None)
            if value is not None and _binds_beyond_loopback(value):
                public.append(key)
        return public


#: Largest cluster secret file read, in bytes (a secret is a line, not a document).
MAX_SECRET_FILE = 4096
#: Config keys holding listener endpoint strings.
_LISTENER_KEYS = ("psc", "wamp", "http", "nsd", "tep")


def read_cluster_secret(path: str, key: str = "cluster-secret-file") -> bytes:
    """The secret in ``path``; :class:`ConfigError` naming ``key`` when unusable."""
    from pubsubclub.federation.auth import MIN_SECRET_LENGTH

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_FILE + 1)
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_SECRET_FILE:
        raise ConfigError(key, f"{path} is longer than {MAX_SECRET_FILE} bytes")
    secret = data.rstrip(b"\r\n")
    if not secret:
        raise ConfigError(key, f"{path} is empty")
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(key, f"the secret in {path} is shorter than {MIN_SECRET_LENGTH} bytes")
    return secret


def _binds_beyond_loopback(endpoint: str) -> bool:
    try:
        kind, _args, kwargs = _parseServer(endpoint, None)
    except Exception:  # validate() reports bad strings; nothing to warn about here
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
#: Declared type of each field, as text (annotations are strings here).
_TYPES = {f.name: str(f.type) for f in fields(NodeConfig)}


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
        values[key] = _typed(name, key, value)
    return values


def _typed(name: str, key: str, value: Any) -> Any:
    """Check a TOML value against the field's declared type."""
    kind = _TYPES[key]
    if "tuple" in kind:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(name, "must be a list of strings")
        return tuple(value)
    if kind.startswith("bool"):
        if not isinstance(value, bool):
            raise ConfigError(name, "must be true or false")
    elif kind.startswith("int"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(name, "must be an integer")
    elif kind.startswith("float"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(name, "must be a number")
        value = float(value)
    elif not isinstance(value, str):
        raise ConfigError(name, "must be a string")
    return value


def build(file_values: dict[str, Any], flag_values: dict[str, Any]) -> NodeConfig:
    """Flags override the file; the result is validated."""
    merged = {**file_values, **{k: v for k, v in flag_values.items() if v is not None}}
    return replace(NodeConfig(), **merged).validate()
