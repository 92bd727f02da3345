"""Node configuration: one declaration per setting, nested in sections, validated once.

Every setting is a field of a section dataclass below, declared with
:func:`setting`: its default, its help text, and its command-line flag. From
that one declaration come the TOML key (``[section] key``, or a top-level key
for :class:`NodeSection`), the ``pubsubclub node`` flag with its ``--help``
line and default (:func:`add_flags`), and the type check of TOML values.
Adding a setting is adding one field.

A section is handed whole to the component it configures (``config.nsd`` to
the NSD front-end, ``config.federation`` to the federation, ...); see
docs/configuration.md. The flat keys of earlier versions (``consul-ttl = 5``
at the top level) still load, each with a deprecation warning naming its new
place.

Why one long module: most of its length is the declarations themselves, one
per setting, which is the point of keeping them in one place.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from twisted.internet.endpoints import _parseServer  # type: ignore[attr-defined]

from pubsubclub.core.dumpfile import DUMP_FORMATS

if TYPE_CHECKING:
    from pubsubclub.core.loginthrottle import LoginThrottleSettings
    from pubsubclub.frontends.wamp.auth import AuthPolicy


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key {key!r}: {problem}")
        self.key = key


LISTEN_ROLES = ("producer", "consumer")
CONSUL_CHECKS = ("ttl", "http")
LOG_LEVELS = ("debug", "info", "warn", "error")


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    shown_default: str | None = None,
    advanced: bool = False,
) -> Any:
    """Declare one setting: a dataclass field that also knows its flag and help text.

    ``flag`` defaults to ``--<section>-<key>`` (``--<key>`` at the top level).
    A boolean that defaults to true gets a ``--no-...`` flag. ``advanced``
    settings are left out of ``--help`` (they still have a flag and a key).
    """
    meta = {
        "help": help,
        "flag": flag,
        "metavar": metavar,
        "choices": choices,
        "shown_default": shown_default,
        "advanced": advanced,
    }
    return field(default=default, metadata=meta)


MiB = 1024 * 1024


@dataclass(frozen=True)
class NodeSection:
    """Top-level keys: the node as a whole."""

    name: str | None = setting(None, "node id, unique in the cluster", metavar="NAME", shown_default="a random id")
    data_dir: str = setting("pubsubclub-data", "folder for the node's stores", metavar="DIR")
    http: str | None = setting(
        None,
        "operations listener: /health, /stats, /metrics, /tep (keep it private)",
        metavar="ENDPOINT",
        shown_default="off",
    )
    log_level: str = setting("info", "least severe log level written to stderr", choices=LOG_LEVELS)
    auth: str | None = setting(
        None,
        "WAMP principals and roles, also applied to TEP and NSD (docs/security.md)",
        metavar="FILE.toml",
        shown_default="none: every client anonymous, everything allowed",
    )
    auth_failures_before_delay: int = setting(
        5,
        "failed logins (WAMP ticket, WAMP-CRA, cryptosign; the TEP operator token) one source address may make"
        " before it is locked out; attempts while locked out are refused unchecked",
        metavar="N",
    )
    auth_failure_delay: float = setting(
        1.0, "first lockout after those failures, in seconds; each further failure doubles it", metavar="S"
    )
    auth_max_delay: float = setting(60.0, "longest lockout after failed logins, in seconds", metavar="S")
    auth_failure_memory: float = setting(
        600.0, "a source address with no failed login for this long starts again from zero, in seconds", metavar="S"
    )
    auth_max_sources: int = setting(
        10_000, "source addresses whose failed logins are remembered (IPv6 per /64); past it the oldest go", metavar="N"
    )
    max_message_size: int = setting(MiB, "largest WAMP, PSC or TEP message accepted, in bytes", metavar="BYTES")
    max_send_buffer: int = setting(
        16 * MiB, "a WAMP or TEP client with more unread is dropped as a slow consumer", metavar="BYTES"
    )
    max_json_depth: int = setting(64, "deepest array/object nesting any client or peer may send", metavar="N")
    max_subscribed_topics: int = setting(
        100_000,
        "topics with subscribers on this node at most, all front-ends together; a client's subscribe to one more"
        " gets an error",
        metavar="N",
    )
    shutdown_timeout: float = setting(
        5.0,
        "longest a graceful stop (SIGINT/SIGTERM) may take before the node exits anyway, in seconds",
        metavar="S",
    )


@dataclass(frozen=True)
class WampSection:
    """``[wamp]``: the WAMP front-end."""

    listen: str = setting(
        "tcp:8080:interface=127.0.0.1",
        "WAMP listener, a Twisted endpoint (WebSocket at /ws, chat page at /)",
        flag="--wamp",
        metavar="ENDPOINT",
    )
    realm: str = setting(
        "realm1", "WAMP realm served (pubsubclub bridge: the router's realm it joins)", flag="--realm", metavar="REALM"
    )
    rawsocket: str | None = setting(
        None,
        "WAMP over RawSocket (JSON and MessagePack; Autobahn's rs:// URLs), e.g. tcp:8090",
        flag="--rawsocket",
        metavar="ENDPOINT",
        shown_default="off",
    )
    chat_page: bool = setting(True, "serve the browser chat page at /", flag="--no-chat-page")
    join_timeout: float = setting(
        10.0,
        "seconds a WAMP client may take to open its WebSocket or RawSocket connection, and again to be WELCOMEd,"
        " before it is closed",
        metavar="S",
    )
    call_timeout: float = setting(
        0.0, "longest a node-local RPC call may take, in seconds (0: only the caller's own timeout option)", metavar="S"
    )
    max_pending_calls: int = setting(
        1000, "node-local RPC calls one session may have in flight; one more gets an ERROR at once", metavar="N"
    )
    max_calls_per_node: int = setting(
        10_000, "node-local RPC calls in flight on the node, all sessions together; one more gets an ERROR", metavar="N"
    )
    max_subscriptions: int = setting(
        1000, "subscriptions one WAMP session may hold (exact and pattern); one more gets an ERROR", metavar="N"
    )
    max_registrations: int = setting(
        1000, "procedures one WAMP session may register; one more gets an ERROR", metavar="N"
    )
    max_registrations_per_node: int = setting(
        50_000, "procedures registered on the node, all sessions together; one more gets an ERROR", metavar="N"
    )
    await_interest: bool = setting(
        False,
        "hold SUBSCRIBED until every linked node has the new interest, so a publish made after it on any node"
        " arrives (one round trip per link)",
    )
    disclose_publisher: str = setting(
        "on-request",
        "name a publisher (session, authid, authrole) in its EVENTs' details: never, on-request (a PUBLISH with"
        " disclose_me) or always; decided on the publisher's node",
        choices=("never", "on-request", "always"),
    )


@dataclass(frozen=True)
class FederationSection:
    """``[federation]``: links to the other nodes (PSC)."""

    listen: str | None = setting(
        "tcp:9001:interface=127.0.0.1", "federation listener, path /psc", flag="--psc", metavar="ENDPOINT"
    )
    peers: tuple[str, ...] = setting(
        (), "PSC URL of another node, e.g. ws://127.0.0.1:9002/psc (repeatable)", flag="--peer", metavar="URL"
    )
    listen_role: str = setting(
        "producer", "which role listens, cluster-wide", flag="--listen-role", choices=LISTEN_ROLES
    )
    advertise: str | None = setting(
        None,
        "the PSC URL other nodes use for this node",
        flag="--advertise",
        metavar="URL",
        shown_default="the listener",
    )
    cluster_secret_file: str | None = setting(
        None,
        "links must prove this secret (HMAC) and are sealed with keys derived from it (AES-GCM)",
        flag="--cluster-secret-file",
        metavar="FILE",
        shown_default="none",
    )
    proof_timeout: float = setting(
        5.0,
        "with a secret: seconds a dialler has to send its proof frame after the upgrade",
        flag="--link-proof-timeout",
        metavar="S",
    )
    max_pending_proofs: int = setting(
        256,
        "with a secret: links answered but not yet proven, at most; past it the oldest of the biggest holder goes",
        flag="--max-pending-proofs",
        metavar="N",
    )
    max_pending_proofs_per_address: int = setting(
        16,
        "with a secret: of those, at most N from one address; past it that address's oldest goes",
        flag="--max-pending-proofs-per-address",
        metavar="N",
    )
    ca_file: str | None = setting(
        None,
        "CA certificates that wss:// peers are verified against",
        flag="--ca-file",
        metavar="PEM",
        shown_default="the system's",
    )
    replay_buffer_bytes: int = setting(
        16 * MiB, "PSC 0.3 replay buffer per consumer node", flag="--replay-buffer-bytes", metavar="BYTES"
    )
    replay_window_seconds: float = setting(
        60.0,
        "a dropped link back within S seconds loses nothing (0: extension off)",
        flag="--replay-window-seconds",
        metavar="S",
    )
    max_link_queue: int = setting(
        16 * MiB, "a PSC link with more queued for its peer is dropped", flag="--max-link-queue", metavar="BYTES"
    )
    link_headroom: int = setting(
        64 * 1024,
        "a link frame may hold --max-message-size plus this: room for a PSC301's topic and metadata;"
        " publishes that would not fit are refused before they are acknowledged",
        flag="--link-headroom",
        metavar="BYTES",
    )
    learn_peers: bool = setting(
        True, "tell peers whom this node dials and dial whom they know (off with Consul)", flag="--no-learn-peers"
    )
    batch: bool = setting(
        True, "offer PSC 0.4: a link sends each reactor turn's messages in one frame (needs the replay window)"
    )
    patterns: bool = setting(
        True, "offer PSC 0.5: federate WAMP prefix/wildcard subscriptions (needs batching and the replay window)"
    )
    max_patterns_per_peer: int = setting(
        10_000,
        "patterns (WAMP prefix/wildcard) this node holds at most, a SUBSCRIBE of one more gets an ERROR;"
        " a peer announcing more is disconnected",
        flag="--max-patterns-per-peer",
        metavar="N",
    )


@dataclass(frozen=True)
class ConsulSection:
    """``[consul]``: discovery through the local Consul agent."""

    url: str | None = setting(
        None, "Consul agent URL, e.g. http://127.0.0.1:8500", flag="--consul", metavar="URL", shown_default="off"
    )
    service: str = setting(
        "pubsubclub", "Consul service name the nodes register under", flag="--service", metavar="NAME"
    )
    token: str | None = setting(None, "Consul ACL token", metavar="TOKEN", shown_default="none")
    dc: str | None = setting(None, "Consul datacenter", metavar="DC", shown_default="the agent's")
    check: str = setting("ttl", "health check: ttl heartbeats, or http polls of /health", choices=CONSUL_CHECKS)
    ttl: float = setting(10.0, "seconds the TTL check lives without a heartbeat", metavar="SECONDS")
    debounce: float = setting(0.5, "seconds of quiet before a membership change applies", metavar="S", advanced=True)


@dataclass(frozen=True)
class NSDSection:
    """``[nsd]``: the NSD front-end (TCP, JSON lines)."""

    listen: str | None = setting(
        None, "NSD listener, e.g. tcp:7000", flag="--nsd", metavar="ENDPOINT", shown_default="off"
    )
    prefix: str = setting("", "hub topic prefix of NSD channels", metavar="PREFIX", shown_default="none")
    max_message_chars: int = setting(65_536, "largest NSD message, in characters", metavar="N")
    retention_count: int = setting(10_000, "NSD messages kept per channel (0: all)", metavar="N")
    retention_seconds: float = setting(0.0, "NSD history age limit in seconds (0: none)", metavar="S")
    max_clock_skew: float = setting(
        3600.0, "seconds an NSD when/stamp from another node may be ahead of this clock", metavar="S"
    )


@dataclass(frozen=True)
class TEPSection:
    """``[tep]``: the TEP front-end (WebSocket at /tep)."""

    listen: str | None = setting(
        None, "TEP listener, e.g. tcp:7100", flag="--tep", metavar="ENDPOINT", shown_default="off"
    )
    prefix: str = setting("", "hub topic prefix of TEP channels", metavar="PREFIX", shown_default="none")
    client_publish: bool = setting(True, "TEP clients may publish (else they get #error)")
    max_channels: int = setting(100, "channels one TEP client may join", metavar="N")
    ops_token_file: str | None = setting(
        None,
        "bearer token of the TEP operator API (/tep on --http)",
        metavar="FILE",
        shown_default="none: the API is off",
    )


@dataclass(frozen=True)
class StreamSection:
    """``[stream]``: the stream front-end (TCP, Kafka-style, docs/stream.md), its durable log under data-dir."""

    listen: str | None = setting(
        None,
        "stream listener, e.g. tcp:7878:interface=127.0.0.1",
        flag="--stream",
        metavar="ENDPOINT",
        shown_default="off",
    )
    prefix: str = setting("", "hub topic prefix of stream topics", metavar="PREFIX", shown_default="none")
    fsync: bool = setting(True, "Status OK only after fsync (one per reactor turn); off: after write() only")
    segment_bytes: int = setting(64 * MiB, "log segment size", metavar="BYTES")
    retention_bytes: int = setting(1024 * MiB, "log kept per topic (0: unlimited)", metavar="BYTES")
    retention_seconds: float = setting(7 * 86400.0, "log age kept (0: unlimited)", metavar="S")
    max_header_bytes: int = setting(8192, "largest JSON header a client may send", metavar="BYTES")
    max_payload_bytes: int = setting(
        16 * MiB,
        "largest payload a client may publish (also at most what fits a PSC link: max-message-size)",
        metavar="BYTES",
    )
    max_pending_bytes: int = setting(
        64 * MiB,
        "half-received headers and payloads of all stream connections together; past it ERROR 503 and close",
        metavar="BYTES",
    )
    max_open_files: int = setting(128, "log segment files open at once, all topics together (an LRU)", metavar="N")
    max_topics: int = setting(
        10_000, "topics the stream log keeps at most; a new one past it gets ERROR 429", metavar="N"
    )
    max_disk_bytes: int = setting(
        10 * 1024 * MiB,
        "stream log on disk, all topics; oldest segments go first, then publishes get ERROR 507 (0: unlimited)",
        metavar="BYTES",
    )


@dataclass(frozen=True)
class SysVSection:
    """``[sysv]``: the System V message-queue front-end (docs/sysv.md)."""

    key: str | None = setting(None, "System V queue key, e.g. 0x420", flag="--sysv", metavar="KEY", shown_default="off")
    prefix: str = setting("", "hub topic prefix of SysV channels", metavar="PREFIX", shown_default="none")
    max_users: int = setting(16, "logged-in users at most", metavar="N")
    max_channels: int = setting(16, "channels at most", metavar="N")
    max_subscriptions: int = setting(64, "subscriptions at most, all users together", metavar="N")
    max_blocks: int = setting(64, "blocks at most, all users together", metavar="N")
    client_queue_share: int = setting(
        64, "deliveries waiting in the queue for one client before further ones are dropped", metavar="N"
    )
    stray_grace: float = setting(
        2.0,
        "seconds a reply to a PID that is not logged in may wait for it; after that, and at once for PIDs the node"
        " never answered, messages on the queue for PIDs no logged-in client has are removed (checked every second)",
        metavar="S",
    )


@dataclass(frozen=True)
class EdgeSection:
    """``[edge]``: the connection layer every listener stands on (pubsubclub/net, docs/security.md)."""

    handshake_timeout: float = setting(
        10.0,
        "seconds a new connection on any listener has to complete its protocol's handshake"
        " (WAMP listeners: at least twice --wamp-join-timeout); also how long a connection may hold an"
        " unfinished message while sending nothing",
        metavar="S",
    )
    idle_timeout: float = setting(
        30.0,
        "seconds without a byte received before a connection is closed, after its handshake, on the listeners"
        " that ping (WAMP WebSocket and RawSocket, TEP, PSC) and the ops listener (0: never)",
        metavar="S",
    )
    ping_interval: float = setting(
        10.0,
        "seconds of quiet after which WAMP (WebSocket and RawSocket) and TEP clients are pinged; a client that"
        " answers is never idle (0: no pings)",
        metavar="S",
    )
    nsd_idle_timeout: float = setting(
        0.0, "idle timeout of NSD clients after their first request (NSD has no keepalive; 0: never)", metavar="S"
    )
    stream_idle_timeout: float = setting(
        0.0, "idle timeout of stream clients after Connect (no keepalive in the protocol; 0: never)", metavar="S"
    )
    max_per_address: int = setting(
        1000, "open connections one source address may hold on one listener; more are refused", metavar="N"
    )
    max_connections: int = setting(10_000, "open connections on one listener; more are refused", metavar="N")
    max_partial_input: int = setting(
        64 * MiB,
        "bytes of unfinished lines, frames and headers all connections together may hold; past it the largest"
        " holders are closed (0: no budget)",
        metavar="BYTES",
    )
    log_interval: float = setting(
        10.0, "seconds between log lines summing refused or closed connections", metavar="S", advanced=True
    )


@dataclass(frozen=True)
class MetricsSection:
    """``[metrics]``: dumps and the Prometheus scrape."""

    dir: str | None = setting(None, "write metrics dumps here (docs/metrics.md)", metavar="DIR", shown_default="off")
    interval: float = setting(10.0, "seconds between metrics dumps", metavar="S")
    max_topics: int = setting(200, "topics with their own /metrics series; the rest summed as __other__", metavar="N")
    dump_format: str = setting(
        "jsonl",
        "file format of the metrics dumps: JSON lines, Parquet (needs pyarrow: the parquet extra), or both",
        choices=DUMP_FORMATS,
    )
    merge_hours: bool = setting(
        True, "merge each closed hour's Parquet dumps of the node into one file (docs/metrics.md)"
    )


#: The authrole every bridge session must have on its router (docs/bridge.md).
BRIDGE_ROLE = "pubsubclub-bridge"
#: Environment variables that may hold a bridge's router credentials instead of files.
BRIDGE_TICKET_ENV = "PUBSUBCLUB_BRIDGE_TICKET"
BRIDGE_CRA_SECRET_ENV = "PUBSUBCLUB_BRIDGE_CRA_SECRET"


@dataclass(frozen=True)
class BridgeSection:
    """``[bridge]``: ``pubsubclub bridge``, a node whose local side is a WAMP router it joins (docs/bridge.md)."""

    router: str | None = setting(
        None,
        "WebSocket URL of the WAMP router a bridge joins, e.g. ws://127.0.0.1:8080/ws",
        flag="--router",
        metavar="URL",
        shown_default="none (required by pubsubclub bridge)",
    )
    authid: str | None = setting(
        None,
        "authid the bridge authenticates as (with a ticket or WAMP-CRA secret)",
        flag="--authid",
        metavar="ID",
        shown_default="none: anonymous",
    )
    ticket_file: str | None = setting(
        None,
        f"file holding the bridge's WAMP ticket (or ${BRIDGE_TICKET_ENV})",
        flag="--ticket-file",
        metavar="FILE",
        shown_default="none",
    )
    cra_secret_file: str | None = setting(
        None,
        f"file holding the bridge's WAMP-CRA secret (or ${BRIDGE_CRA_SECRET_ENV})",
        flag="--cra-secret-file",
        metavar="FILE",
        shown_default="none",
    )
    role: str = setting(
        BRIDGE_ROLE,
        "authrole the router gives bridges: sessions with it are bridges (their subscriptions are no interest)",
        flag="--bridge-role",
        metavar="ROLE",
    )
    lock: str = setting(
        "pubsubclub.bridge.active",
        "procedure the active bridge of a router registers (one bridge per router is active)",
        flag="--bridge-lock",
        metavar="URI",
        advanced=True,
    )


#: Section name in TOML and on NodeConfig -> its dataclass; "" is the top level.
SECTIONS: dict[str, type] = {
    "": NodeSection,
    "wamp": WampSection,
    "federation": FederationSection,
    "consul": ConsulSection,
    "nsd": NSDSection,
    "tep": TEPSection,
    "stream": StreamSection,
    "sysv": SysVSection,
    "edge": EdgeSection,
    "metrics": MetricsSection,
    "bridge": BridgeSection,
}


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
        """The flat top-level TOML key of earlier versions (the flag without dashes or ``no-``)."""
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


def declared() -> Iterator[Setting]:
    """Every setting, section by section, in declaration order."""
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            yield Setting(section, f.name, f)


_BY_ID = {s.id: s for s in declared()}
#: Flat keys of earlier versions -> the setting (also what tests and callers pass as flag values).
_BY_LEGACY = {s.legacy_key.replace("-", "_"): s for s in declared()}
_BY_LEGACY["peers"] = _BY_LEGACY["peer"]


@dataclass(frozen=True)
class NodeConfig:
    """Everything ``pubsubclub node`` needs, one section per component."""

    node: NodeSection = NodeSection()
    wamp: WampSection = WampSection()
    federation: FederationSection = FederationSection()
    consul: ConsulSection = ConsulSection()
    nsd: NSDSection = NSDSection()
    tep: TEPSection = TEPSection()
    stream: StreamSection = StreamSection()
    sysv: SysVSection = SysVSection()
    edge: EdgeSection = EdgeSection()
    metrics: MetricsSection = MetricsSection()
    bridge: BridgeSection = BridgeSection()
    #: Deprecation notes from loading (logged when the node starts).
    warnings: tuple[str, ...] = ()

    def validate(self) -> NodeConfig:
        """Return self, or raise :class:`ConfigError` naming the first bad key."""
        node, wamp, fed, consul, nsd, tep, metrics = (
            self.node,
            self.wamp,
            self.federation,
            self.consul,
            self.nsd,
            self.tep,
            self.metrics,
        )
        if node.name is not None and (not node.name or len(node.name) > 128 or any(c.isspace() for c in node.name)):
            raise ConfigError("name", "must be 1-128 characters without spaces")
        _check_endpoint("wamp", wamp.listen)
        if wamp.rawsocket is not None:
            _check_endpoint("rawsocket", wamp.rawsocket)
        if fed.listen is not None:
            _check_endpoint("psc", fed.listen)
        if not wamp.realm or len(wamp.realm) > 255:
            raise ConfigError("realm", "must be a non-empty WAMP URI")
        for url in fed.peers:
            _check_url("peer", url)
        if fed.advertise is not None:
            _check_url("advertise", fed.advertise)
        if fed.listen_role not in LISTEN_ROLES:
            raise ConfigError("listen-role", f"must be one of {', '.join(LISTEN_ROLES)}, not {fed.listen_role!r}")
        if not isinstance(node.shutdown_timeout, (int, float)) or not 0.1 <= node.shutdown_timeout <= 3600:
            raise ConfigError("shutdown-timeout", "must be a number of seconds between 0.1 and 3600")
        if node.log_level not in LOG_LEVELS:
            raise ConfigError("log-level", f"must be one of {', '.join(LOG_LEVELS)}, not {node.log_level!r}")
        if node.http is not None:
            _check_endpoint("http", node.http)
        if consul.url is not None:
            _check_http_url("consul", consul.url)
        if consul.check not in CONSUL_CHECKS:
            raise ConfigError("consul-check", f"must be one of {', '.join(CONSUL_CHECKS)}, not {consul.check!r}")
        if consul.url is not None and consul.check == "http" and node.http is None:
            raise ConfigError("consul-check", "http needs --http (the agent polls its /health)")
        if not isinstance(consul.ttl, (int, float)) or not 0.3 <= consul.ttl <= 86400:
            raise ConfigError("consul-ttl", "must be a number of seconds between 0.3 and 86400")
        if not isinstance(consul.debounce, (int, float)) or not 0 <= consul.debounce <= 60:
            raise ConfigError("consul-debounce", "must be a number of seconds between 0 and 60")
        if not consul.service or len(consul.service) > 128:
            raise ConfigError("service", "must be 1-128 characters")
        for key, path in (
            ("cluster-secret-file", fed.cluster_secret_file),
            ("ca-file", fed.ca_file),
            ("tep-ops-token-file", tep.ops_token_file),
        ):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(key, f"no such file: {path}")
        self.cluster_secret()
        self.tep_ops_token()
        self.trust_root()
        if type(metrics.max_topics) is not int or not 1 <= metrics.max_topics <= 100_000:
            raise ConfigError("metrics-max-topics", "must be an integer between 1 and 100000")
        if nsd.listen is not None:
            _check_endpoint("nsd", nsd.listen)
        if not isinstance(wamp.join_timeout, (int, float)) or not 0.1 <= wamp.join_timeout <= 3600:
            raise ConfigError("wamp-join-timeout", "must be a number of seconds between 0.1 and 3600")
        if type(wamp.max_pending_calls) is not int or not 1 <= wamp.max_pending_calls <= 1_000_000:
            raise ConfigError("wamp-max-pending-calls", "must be an integer between 1 and 1000000")
        for key, value in (
            ("wamp-max-calls-per-node", wamp.max_calls_per_node),
            ("wamp-max-subscriptions", wamp.max_subscriptions),
            ("wamp-max-registrations", wamp.max_registrations),
            ("wamp-max-registrations-per-node", wamp.max_registrations_per_node),
            ("max-subscribed-topics", node.max_subscribed_topics),
        ):
            if type(value) is not int or not 1 <= value <= 10_000_000:
                raise ConfigError(key, "must be an integer between 1 and 10000000")
        if metrics.dump_format not in DUMP_FORMATS:
            raise ConfigError(
                "metrics-dump-format", f"must be one of {', '.join(DUMP_FORMATS)}, not {metrics.dump_format!r}"
            )
        if not 0.05 <= metrics.interval <= 86_400:
            raise ConfigError("metrics-interval", "must be between 0.05 and 86400 seconds")
        if not node.data_dir:
            raise ConfigError("data-dir", "must be a folder path")
        if not isinstance(nsd.max_message_chars, int) or nsd.max_message_chars < 1:
            raise ConfigError("nsd-max-message-chars", "must be a positive integer")
        if nsd.retention_count < 0 or nsd.retention_seconds < 0:
            raise ConfigError(
                "nsd-retention-count" if nsd.retention_count < 0 else "nsd-retention-seconds", "must not be negative"
            )
        if tep.listen is not None:
            _check_endpoint("tep", tep.listen)
        if (
            not isinstance(tep.prefix, str)
            or len(tep.prefix) > 128
            or tep.prefix.startswith("$")
            or not tep.prefix.isprintable()
            or " " in tep.prefix
        ):
            raise ConfigError("tep-prefix", "must be at most 128 printable characters, no spaces, not starting with $")
        if not isinstance(tep.max_channels, int) or not 1 <= tep.max_channels <= 100_000:
            raise ConfigError("tep-max-channels", "must be an integer between 1 and 100000")
        if not isinstance(node.max_message_size, int) or not 1024 <= node.max_message_size <= 64 * MiB:
            raise ConfigError("max-message-size", "must be an integer between 1024 and 67108864")
        if (
            not isinstance(fed.link_headroom, int)
            or isinstance(fed.link_headroom, bool)
            or not 16 * 1024 <= fed.link_headroom <= 64 * MiB
        ):
            raise ConfigError("link-headroom", "must be an integer between 16384 and 67108864")
        if (
            not isinstance(fed.replay_buffer_bytes, int)
            or isinstance(fed.replay_buffer_bytes, bool)
            or not 65_536 <= fed.replay_buffer_bytes <= 2**40
        ):
            raise ConfigError("replay-buffer-bytes", "must be an integer between 65536 and 1099511627776")
        if (
            not isinstance(fed.replay_window_seconds, (int, float))
            or isinstance(fed.replay_window_seconds, bool)
            or not 0 <= fed.replay_window_seconds <= 86_400
        ):
            raise ConfigError("replay-window-seconds", "must be a number of seconds between 0 (off) and 86400")
        if (
            not isinstance(fed.proof_timeout, (int, float))
            or isinstance(fed.proof_timeout, bool)
            or not 0.1 <= fed.proof_timeout <= 3600
        ):
            raise ConfigError("link-proof-timeout", "must be a number of seconds between 0.1 and 3600")
        for key, value in (
            ("max-pending-proofs", fed.max_pending_proofs),
            ("max-pending-proofs-per-address", fed.max_pending_proofs_per_address),
        ):
            if type(value) is not int or not 1 <= value <= 1_000_000:
                raise ConfigError(key, "must be an integer between 1 and 1000000")
        if type(fed.max_patterns_per_peer) is not int or not 1 <= fed.max_patterns_per_peer <= 1_000_000:
            raise ConfigError("max-patterns-per-peer", "must be an integer between 1 and 1000000")
        for key, value in (("max-send-buffer", node.max_send_buffer), ("max-link-queue", fed.max_link_queue)):
            if type(value) is not int or not 65_536 <= value <= 2**40:
                raise ConfigError(key, "must be an integer between 65536 and 1099511627776")
        self.auth_policy()
        if type(node.max_json_depth) is not int or not 2 <= node.max_json_depth <= 200:
            raise ConfigError("max-json-depth", "must be an integer between 2 and 200")
        if not isinstance(nsd.max_clock_skew, (int, float)) or not 1 <= nsd.max_clock_skew <= 366 * 86400:
            raise ConfigError("nsd-max-clock-skew", "must be a number of seconds between 1 and 31622400")
        for key, prefix in (
            ("nsd-prefix", nsd.prefix),
            ("stream-prefix", self.stream.prefix),
            ("sysv-prefix", self.sysv.prefix),
        ):
            _check_prefix(key, prefix)
        self._validate_stream()
        self._validate_sysv()
        self._validate_edge()
        self._validate_bridge()
        self._validate_login_throttle()
        return self

    def _validate_login_throttle(self) -> None:
        node = self.node
        for key, count in (
            ("auth-failures-before-delay", node.auth_failures_before_delay),
            ("auth-max-sources", node.auth_max_sources),
        ):
            if type(count) is not int or not 1 <= count <= 10_000_000:
                raise ConfigError(key, "must be an integer between 1 and 10000000")
        for key, seconds in (
            ("auth-failure-delay", node.auth_failure_delay),
            ("auth-max-delay", node.auth_max_delay),
            ("auth-failure-memory", node.auth_failure_memory),
        ):
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds <= 86_400:
                raise ConfigError(key, "must be a number of seconds between 0 and 86400")

    def login_throttle_settings(self) -> LoginThrottleSettings:
        """The ``[node] auth-*`` settings as the login throttle takes them."""
        from pubsubclub.core.loginthrottle import LoginThrottleSettings

        node = self.node
        return LoginThrottleSettings(
            failures_before_delay=node.auth_failures_before_delay,
            first_delay=float(node.auth_failure_delay),
            max_delay=float(node.auth_max_delay),
            forget_after=float(node.auth_failure_memory),
            max_sources=node.auth_max_sources,
        )

    def _validate_bridge(self) -> None:
        bridge = self.bridge
        if bridge.router is not None:
            _check_url("router", bridge.router)
        for key, value in (("bridge-role", bridge.role), ("bridge-lock", bridge.lock)):
            if not isinstance(value, str) or not value or len(value) > 255 or not value.isprintable() or " " in value:
                raise ConfigError(key, "must be a WAMP URI or name: 1-255 printable characters, no spaces")
        if bridge.authid is not None and (not bridge.authid or len(bridge.authid) > 255):
            raise ConfigError("authid", "must be 1-255 characters")
        for key, path in (("ticket-file", bridge.ticket_file), ("cra-secret-file", bridge.cra_secret_file)):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(key, f"no such file: {path}")
        if bridge.router is None:
            return  # not a bridge: $PUBSUBCLUB_BRIDGE_* in a node's environment mean nothing
        ticket, secret = self.bridge_credentials()
        if (ticket is not None or secret is not None) and bridge.authid is None:
            raise ConfigError("authid", "a ticket or WAMP-CRA secret needs --authid")

    def bridge_credentials(self) -> tuple[str | None, str | None]:
        """The bridge's router ticket and WAMP-CRA secret (files first, then the environment), each or None."""
        bridge = self.bridge
        found: list[str | None] = []
        for key, path, env in (
            ("ticket-file", bridge.ticket_file, BRIDGE_TICKET_ENV),
            ("cra-secret-file", bridge.cra_secret_file, BRIDGE_CRA_SECRET_ENV),
        ):
            if path is not None:
                found.append(read_cluster_secret(path, key=key, min_length=1).decode("utf-8", "replace"))
            else:
                found.append(os.environ.get(env) or None)
        return found[0], found[1]

    def _validate_stream(self) -> None:
        stream = self.stream
        if stream.listen is not None:
            _check_endpoint("stream", stream.listen)
        for key, value, low, high in (
            ("stream-segment-bytes", stream.segment_bytes, 4096, 2**40),
            ("stream-retention-bytes", stream.retention_bytes, 0, 2**50),
            ("stream-max-header-bytes", stream.max_header_bytes, 256, 16 * MiB),
            ("stream-max-payload-bytes", stream.max_payload_bytes, 1, 1024 * MiB),
            ("stream-max-pending-bytes", stream.max_pending_bytes, 1024, 2**40),
            ("stream-max-open-files", stream.max_open_files, 1, 1_000_000),
            ("stream-max-topics", stream.max_topics, 1, 100_000_000),
            ("stream-max-disk-bytes", stream.max_disk_bytes, 0, 2**60),
        ):
            if type(value) is not int or not low <= value <= high:
                raise ConfigError(key, f"must be an integer between {low} and {high}")
        if not isinstance(stream.retention_seconds, (int, float)) or stream.retention_seconds < 0:
            raise ConfigError("stream-retention-seconds", "must be a number of seconds, 0 for unlimited")

    def _validate_sysv(self) -> None:
        sysv = self.sysv
        if sysv.key is not None:
            try:
                number = int(sysv.key, 0)
            except ValueError:
                raise ConfigError("sysv", f"must be an integer key such as 0x420, not {sysv.key!r}") from None
            if not 1 <= number <= 0x7FFFFFFF:
                raise ConfigError("sysv", "must be a positive 32-bit key (IPC_PRIVATE, 0, is not allowed)")
        for key, value in (
            ("sysv-max-users", sysv.max_users),
            ("sysv-max-channels", sysv.max_channels),
            ("sysv-max-subscriptions", sysv.max_subscriptions),
            ("sysv-max-blocks", sysv.max_blocks),
            ("sysv-client-queue-share", sysv.client_queue_share),
        ):
            if type(value) is not int or not 1 <= value <= 100_000:
                raise ConfigError(key, "must be an integer between 1 and 100000")
        grace = sysv.stray_grace
        if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not 0 <= grace <= 3600:
            raise ConfigError("sysv-stray-grace", "must be a number of seconds between 0 and 3600")

    def _validate_edge(self) -> None:
        edge = self.edge
        for key, seconds, low in (
            ("edge-handshake-timeout", edge.handshake_timeout, 0.1),
            ("edge-idle-timeout", edge.idle_timeout, 0),
            ("edge-ping-interval", edge.ping_interval, 0),
            ("edge-nsd-idle-timeout", edge.nsd_idle_timeout, 0),
            ("edge-stream-idle-timeout", edge.stream_idle_timeout, 0),
            ("edge-log-interval", edge.log_interval, 0.1),
        ):
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not low <= seconds <= 86_400:
                raise ConfigError(key, f"must be a number of seconds between {low:g} and 86400")
        if edge.idle_timeout and edge.ping_interval and edge.ping_interval >= edge.idle_timeout:
            raise ConfigError("edge-ping-interval", "must be shorter than edge-idle-timeout (or either 0)")
        for key, value, high in (
            ("edge-max-per-address", edge.max_per_address, 10_000_000),
            ("edge-max-connections", edge.max_connections, 10_000_000),
            ("edge-max-partial-input", edge.max_partial_input, 2**40),
        ):
            if type(value) is not int or not 0 <= value <= high:
                raise ConfigError(key, f"must be an integer between 0 (no cap) and {high}")

    def auth_policy(self) -> AuthPolicy | None:
        """The :class:`~pubsubclub.frontends.wamp.auth.AuthPolicy` of ``auth``, or None; ConfigError naming the line."""
        path = self.node.auth
        if path is None:
            return None
        from pubsubclub.frontends.wamp.auth import AuthFileError, load_auth

        try:
            return load_auth(path)
        except AuthFileError as e:
            where = path if e.line is None else f"{path} line {e.line}"
            raise ConfigError("auth", f"{where}: {e.problem}") from None

    def cluster_secret(self) -> bytes | None:
        """The cluster secret (file contents without the trailing line break), or None."""
        if self.federation.cluster_secret_file is None:
            return None
        return read_cluster_secret(self.federation.cluster_secret_file)

    def sysv_key(self) -> int | None:
        """The SysV queue key as an integer (``0x420`` -> 1056), or None when the front-end is off."""
        return None if self.sysv.key is None else int(self.sysv.key, 0)

    def tep_ops_token(self) -> bytes | None:
        """The TEP operator API's bearer token (file contents without the trailing line break), or None."""
        if self.tep.ops_token_file is None:
            return None
        return read_cluster_secret(self.tep.ops_token_file, key="tep-ops-token-file")

    def trust_root(self) -> Any:
        """The CAs of ``ca_file`` as a Twisted trust root, or None (the platform's CAs)."""
        path = self.federation.ca_file
        if path is None:
            return None
        from pubsubclub.federation.tls import load_trust_root

        try:
            return load_trust_root(path)
        except OSError as e:
            raise ConfigError("ca-file", f"cannot read {path}: {e.strerror}") from None
        except ValueError:
            raise ConfigError("ca-file", f"{path} holds no PEM certificate") from None

    def listeners(self) -> dict[str, str]:
        """Every configured listener endpoint, by its flag name (wamp, psc, http, nsd, tep)."""
        found = {
            "psc": self.federation.listen,
            "wamp": self.wamp.listen,
            "http": self.node.http,
            "nsd": self.nsd.listen,
            "tep": self.tep.listen,
            "stream": self.stream.listen,
            "rawsocket": self.wamp.rawsocket,
        }
        return {key: value for key, value in found.items() if value is not None}

    def public_listeners(self) -> list[str]:
        """Flag names of the TCP/TLS listeners not bound to a loopback address (no interface: every address)."""
        return [key for key, value in self.listeners().items() if _binds_beyond_loopback(value)]


#: Largest cluster secret file read, in bytes (a secret is a line, not a document).
MAX_SECRET_FILE = 4096


def read_cluster_secret(path: str, key: str = "cluster-secret-file", min_length: int | None = None) -> bytes:
    """The secret in ``path``; :class:`ConfigError` naming ``key`` when unusable."""
    from pubsubclub.federation.auth import MIN_SECRET_LENGTH

    if min_length is None:
        min_length = MIN_SECRET_LENGTH
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
    if len(secret) < min_length:
        raise ConfigError(key, f"the secret in {path} is shorter than {min_length} bytes")
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


def _check_prefix(key: str, value: Any) -> None:
    """A hub topic prefix: short, printable, no spaces, never reaching the reserved ``$`` topics."""
    if (
        not isinstance(value, str)
        or len(value) > 128
        or value.startswith("$")
        or not value.isprintable()
        or " " in value
    ):
        raise ConfigError(key, "must be at most 128 printable characters, no spaces, not starting with $")


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


# -- loading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileValues:
    """What a TOML file set: setting id -> value, and deprecation notes."""

    values: dict[str, Any]
    warnings: tuple[str, ...] = ()


def load_toml(path: str) -> FileValues:
    """Read a TOML config file: sections and their keys, or the deprecated flat keys."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError("config", f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from None
    values: dict[str, Any] = {}
    warnings: list[str] = []
    for name, value in raw.items():
        if name in SECTIONS and name and isinstance(value, dict):
            for key, item in value.items():
                found = _BY_ID.get(f"{name}.{key.replace('_', '-')}")
                if found is None:
                    near = _near_key(name, key)
                    raise ConfigError(f"{name}.{key}", f"unknown key in section [{name}] of {path}{near}")
                if found.id in values:
                    raise ConfigError(found.id, f"set twice in {path} (flat and in [{found.section}])")
                values[found.id] = _typed(found.id, found, item)
            continue
        found = _BY_ID.get(name.replace("_", "-"))
        if found is None:
            found = _BY_LEGACY.get(name.replace("-", "_"))
            if found is None:
                raise ConfigError(name, f"unknown key in {path}{_near_key('', name)}")
            warnings.append(
                f"{path}: config key {name!r} is deprecated; write it as {found.toml_name()}"
                " (flat keys will stop working in a later version)"
            )
        if found.id in values:
            raise ConfigError(name, f"set twice in {path} (flat and in [{found.section}])")
        values[found.id] = _typed(name, found, value)
    return FileValues(values, tuple(warnings))


def _near_key(section: str, key: str) -> str:
    """What to say after "unknown key": the nearest valid key (difflib), and the keys allowed there."""
    keys = sorted(s.key for s in _BY_ID.values() if s.section == section)
    near: list[str] = []
    if not section:
        keys += sorted(f"[{name}]" for name in SECTIONS if name)
        # A misspelt flat key of earlier versions ("consul_tll") is nearest to a section's key.
        legacy = difflib.get_close_matches(key.replace("-", "_"), list(_BY_LEGACY), n=1, cutoff=0.8)
        near = [_BY_LEGACY[legacy[0]].toml_name()] if legacy else []
    near = near or difflib.get_close_matches(key.replace("_", "-"), keys, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else ""
    where = f"[{section}]" if section else "the top level"
    return f"{hint} (valid at {where}: {', '.join(keys)})"


def _typed(name: str, found: Setting, value: Any) -> Any:
    """Check a TOML value against the setting's declared type."""
    kind = found.kind
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


def _resolve(key: str) -> Setting:
    found = _BY_ID.get(key) or _BY_ID.get(key.replace("_", "-")) or _BY_LEGACY.get(key.replace("-", "_"))
    if found is None:
        raise ConfigError(key, "unknown setting")
    return found


def build(file_values: FileValues | Mapping[str, Any], flag_values: Mapping[str, Any]) -> NodeConfig:
    """Flags override the file; the result is validated.

    Both map a setting to its value, naming it by id (``consul.ttl``,
    ``name``) or by its flat name (``consul_ttl``); None means "not given".
    """
    given: Mapping[str, Any]
    if isinstance(file_values, FileValues):
        warnings, given = file_values.warnings, file_values.values
    else:
        warnings, given = (), file_values
    merged: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for source in (given, flag_values):
        for key, value in source.items():
            if value is None:
                continue
            found = _resolve(key)
            merged[found.section][found.attr] = value
    sections = {section or "node": replace(cls(), **merged[section]) for section, cls in SECTIONS.items()}
    config = NodeConfig(**sections, warnings=warnings).validate()
    hints = tuple(peer_path_hint(url) for url in config.federation.peers if urlsplit(url).path != PSC_PATH)
    return replace(config, warnings=(*warnings, *hints)) if hints else config


#: Where every node serves PSC (its --psc listener's path).
PSC_PATH = "/psc"


def peer_path_hint(url: str) -> str:
    """The warning for a --peer URL whose path is not /psc: nodes answer 404 there (or 400 on the WAMP /ws)."""
    parts = urlsplit(url)
    fixed = parts._replace(path=PSC_PATH, query="", fragment="").geturl()
    if not parts.path:
        problem = "has no path"
    elif parts.path == "/ws":
        problem = "points at /ws, the WAMP listener's path"
    else:
        problem = f"points at {parts.path}"
    return (
        f"--peer {url} {problem}, but a node's PSC listener (--psc) answers at {PSC_PATH} only:"
        f" write --peer {fixed} (with the peer's --psc port), unless a proxy maps this path to {PSC_PATH}"
    )


# -- the command line -------------------------------------------------------------------


#: The settings ``pubsubclub bridge`` takes: no client listeners, but the router's.
BRIDGE_SECTIONS = ("", "federation", "consul", "metrics", "bridge")
#: Settings of other sections a bridge uses too.
BRIDGE_EXTRA = ("wamp.realm",)
#: Top-level settings that mean nothing to a bridge (it has no clients of its own).
BRIDGE_UNUSED = ("auth", "max-send-buffer")


def bridge_setting(s: Setting) -> bool:
    """Whether ``pubsubclub bridge`` takes setting ``s``."""
    return (s.section in BRIDGE_SECTIONS and s.id not in BRIDGE_UNUSED) or s.id in BRIDGE_EXTRA


def node_setting(s: Setting) -> bool:
    """Whether ``pubsubclub node`` takes setting ``s`` (every one but the bridge's)."""
    return s.section != "bridge"


def add_flags(parser: argparse.ArgumentParser, include: Callable[[Setting], bool] = node_setting) -> None:
    """One flag per declared setting ``include`` accepts, with its help text and default; all default to "not given"."""
    for s in declared():
        if not include(s):
            continue
        meta = s.field.metadata
        help_text = argparse.SUPPRESS if meta.get("advanced") else s.help_text()
        if s.kind == "bool":
            parser.add_argument(s.flag, dest=s.dest, action="store_const", const=not s.default, help=help_text)
        elif "tuple" in s.kind:
            parser.add_argument(s.flag, dest=s.dest, action="append", metavar=meta.get("metavar"), help=help_text)
        else:
            kind = {"int": int, "float": float}.get(s.kind.split(" ")[0], str)
            parser.add_argument(
                s.flag,
                dest=s.dest,
                type=kind,
                metavar=meta.get("metavar"),
                choices=meta.get("choices"),
                help=help_text,
            )


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, by id (None: not given)."""
    out: dict[str, Any] = {}
    for s in declared():
        value = getattr(args, s.dest, None)
        if value is not None and "tuple" in s.kind:
            value = tuple(value)
        out[s.id] = value
    return out


def add_node_flags(parser: argparse.ArgumentParser) -> None:
    """What ``pubsubclub node`` takes: ``--config FILE.toml`` and one flag per node setting."""
    parser.add_argument("--config", metavar="FILE.toml", help="read settings from a TOML file (flags win)")
    add_flags(parser)


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The configuration of parsed ``pubsubclub node`` arguments: the TOML file's values, then the flags on top."""
    file_values = load_toml(args.config) if args.config else FileValues({})
    return build(file_values, flag_values(args))


def reference_markdown() -> str:
    """The table of every setting (docs/configuration.md holds it verbatim; a test keeps them equal)."""
    rows = ["| TOML | flag | default | what |", "|---|---|---|---|"]
    for s in declared():
        meta = s.field.metadata
        shown = meta.get("shown_default")
        if s.kind == "bool":
            shown = "true" if s.default else "false"
        elif shown is None:
            shown = "none" if s.default in ((), None) else repr(s.default).replace("'", '"')
        text = str(meta["help"]).replace("|", "\\|")
        rows.append(f"| `{s.toml_name()}` | `{s.flag}` | {shown} | {text} |")
    return "\n".join(rows) + "\n"
