"""The client front-ends' config sections: ``[wamp]``, ``[nsd]``, ``[tep]``, ``[stream]``, ``[sysv]``, ``[bridge]``.

Each section is handed whole to the component it configures (``[nsd]`` to the
NSD front-end, ``[federation]`` to the federation, ...); see
docs/configuration.md. A value's bounds, choices and per-value rule are part
of its declaration.

Why one long module: most of its length is the declarations themselves, one
per setting, which is the point of keeping them in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from pubsubclub.config.declare import (
    MiB,
    check_endpoint,
    check_prefix,
    check_realm,
    check_sysv_key,
    check_text,
    check_uri,
    check_ws_url,
    setting,
)

LISTEN_ROLES = ("producer", "consumer")
CONSUL_CHECKS = ("ttl", "http")
LOG_LEVELS = ("debug", "info", "warn", "error")


@dataclass(frozen=True)
class WampSection:
    """``[wamp]``: the WAMP front-end."""

    listen: str = setting(
        "tcp:8080:interface=127.0.0.1",
        "WAMP listener, a Twisted endpoint (WebSocket at /ws, chat page at /)",
        flag="--wamp",
        metavar="ENDPOINT",
        check=check_endpoint,
    )
    realms: tuple[str, ...] = setting(
        ("realm1",),
        "WAMP realms served, each isolated cluster-wide; repeat --realm for several, the first is the realm of a"
        " HELLO without one (pubsubclub bridge: the one router realm it joins). TOML also takes realm = \"NAME\"",
        flag="--realm",
        metavar="REALM",
        shown_default="realm1",
        check=check_realm,
        aliases=("realm",),
    )
    plain_realm: str | None = setting(
        None,
        "the realm whose WAMP topics are the cluster's plain topics, the ones NSD, TEP, stream and SysV clients"
        " meet; every other realm's topic t is $realm.<realm>#t. Must be the same on every node (links between"
        " nodes that disagree are refused)",
        flag="--plain-realm",
        metavar="REALM",
        shown_default="the first realm served",
        check=check_realm,
    )
    rawsocket: str | None = setting(
        None,
        "WAMP over RawSocket (JSON, MessagePack and CBOR; Autobahn's rs:// URLs), e.g. tcp:8090",
        flag="--rawsocket",
        metavar="ENDPOINT",
        shown_default="off",
        check=check_endpoint,
    )
    chat_page: bool = setting(True, "serve the browser chat page at /", flag="--no-chat-page")
    join_timeout: float = setting(
        10.0,
        "seconds a WAMP client may take to open its WebSocket or RawSocket connection, and again to be WELCOMEd,"
        " before it is closed",
        metavar="S",
        min=0.1,
        max=3600,
    )
    call_timeout: float = setting(
        0.0, "longest a node-local RPC call may take, in seconds (0: only the caller's own timeout option)", metavar="S"
    )
    max_pending_calls: int = setting(
        1000,
        "node-local RPC calls one session may have in flight; one more gets an ERROR at once",
        metavar="N",
        min=1,
        max=1_000_000,
    )
    max_calls_per_node: int = setting(
        10_000,
        "node-local RPC calls in flight on the node, all sessions together; one more gets an ERROR",
        metavar="N",
        min=1,
        max=10_000_000,
    )
    max_calls_per_link: int = setting(
        10_000,
        "RPC calls in flight on this node's callees from one other node (one link), all its callers together;"
        " one more gets an ERROR",
        metavar="N",
        min=1,
        max=10_000_000,
    )
    max_subscriptions: int = setting(
        1000,
        "subscriptions one WAMP session may hold (exact and pattern); one more gets an ERROR",
        metavar="N",
        min=1,
        max=10_000_000,
    )
    max_registrations: int = setting(
        1000, "procedures one WAMP session may register; one more gets an ERROR", metavar="N", min=1, max=10_000_000
    )
    max_registrations_per_node: int = setting(
        50_000,
        "procedures registered on the node, all sessions together; one more gets an ERROR",
        metavar="N",
        min=1,
        max=10_000_000,
    )
    max_retained_topics: int = setting(
        10_000,
        "topics with a retained event, the whole cluster's table (each node holds a replica); a retaining"
        " PUBLISH on one more topic gets an ERROR",
        metavar="N",
        min=1,
        max=10_000_000,
    )
    max_retained_bytes: int = setting(
        64 * 1024 * 1024,
        "payload bytes of all retained events together (JSON size); a retaining PUBLISH past it gets an ERROR",
        metavar="BYTES",
        min=1,
        max=2**40,
    )
    await_interest: bool = setting(
        False,
        "hold SUBSCRIBED until every linked node has the new interest, so a publish made after it on any node"
        " arrives, and REGISTERED until every linked node (and worker) has the registration, so a call made"
        " after it on any node reaches it (one round trip per link)",
    )
    await_interest_timeout: float = setting(
        5.0,
        "longest SUBSCRIBED or REGISTERED is held by await-interest for a node that does not answer; then it is"
        " sent anyway (a REGISTERED logged and counted as errors reason registered_unconfirmed)",
        metavar="S",
        min=0.1,
        max=600,
    )
    disclose_publisher: str = setting(
        "on-request",
        "name a publisher (session, authid, authrole) in its EVENTs' details: never, on-request (a PUBLISH with"
        " disclose_me) or always; decided on the publisher's node",
        choices=("never", "on-request", "always"),
    )
    meta_max_results: int = setting(
        10_000,
        "most items (sessions, subscriptions, subscribers, registrations, callees) one WAMP meta API answer lists;"
        " a longer answer is an ERROR",
        metavar="N",
        min=1,
        max=1_000_000,
    )
    meta_timeout: float = setting(
        5.0,
        "seconds a WAMP meta API call waits for the other nodes' answers; a node that gives none is named in an ERROR",
        metavar="S",
        min=0.1,
        max=600,
    )
    meta_max_queries: int = setting(
        100,
        "WAMP meta API calls waiting for other nodes' answers on the node at once; one more gets an ERROR",
        metavar="N",
        min=1,
        max=100_000,
    )

    @property
    def realm(self) -> str:
        """The first realm served: the realm of a HELLO that names none (and a bridge's router realm)."""
        return self.realms[0]

    @property
    def plain(self) -> str:
        """The plain realm: ``plain_realm``, else the first realm served (docs/architecture.md, "Realms")."""
        return self.plain_realm if self.plain_realm is not None else self.realms[0]
    disclose_caller: str = setting(
        "on-request",
        "name a caller (session, authid, authrole) in its INVOCATIONs' details: never, on-request (a CALL with"
        " disclose_me, or a REGISTER with disclose_caller) or always; decided on the caller's node",
        choices=("never", "on-request", "always"),
    )


@dataclass(frozen=True)
class NSDSection:
    """``[nsd]``: the NSD front-end (TCP, JSON lines)."""

    listen: str | None = setting(
        None, "NSD listener, e.g. tcp:7000", flag="--nsd", metavar="ENDPOINT", shown_default="off", check=check_endpoint
    )
    prefix: str = setting(
        "", "hub topic prefix of NSD channels", metavar="PREFIX", shown_default="none", check=check_prefix
    )
    max_message_chars: int = setting(65_536, "largest NSD message, in characters", metavar="N", min=1)
    retention_count: int = setting(10_000, "NSD messages kept per channel (0: all)", metavar="N", min=0)
    retention_seconds: float = setting(0.0, "NSD history age limit in seconds (0: none)", metavar="S", min=0)
    max_clock_skew: float = setting(
        3600.0,
        "seconds an NSD when/stamp from another node may be ahead of this clock",
        metavar="S",
        min=1,
        max=366 * 86_400,
    )


@dataclass(frozen=True)
class TEPSection:
    """``[tep]``: the TEP front-end (WebSocket at /tep)."""

    listen: str | None = setting(
        None, "TEP listener, e.g. tcp:7100", flag="--tep", metavar="ENDPOINT", shown_default="off", check=check_endpoint
    )
    prefix: str = setting(
        "", "hub topic prefix of TEP channels", metavar="PREFIX", shown_default="none", check=check_prefix
    )
    client_publish: bool = setting(True, "TEP clients may publish (else they get #error)")
    max_channels: int = setting(100, "channels one TEP client may join", metavar="N", min=1, max=100_000)
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
        check=check_endpoint,
    )
    prefix: str = setting(
        "", "hub topic prefix of stream topics", metavar="PREFIX", shown_default="none", check=check_prefix
    )
    fsync: bool = setting(True, "Status OK only after fsync (one per reactor turn); off: after write() only")
    segment_bytes: int = setting(64 * MiB, "log segment size", metavar="BYTES", min=4096, max=2**40)
    retention_bytes: int = setting(1024 * MiB, "log kept per topic (0: unlimited)", metavar="BYTES", min=0, max=2**50)
    retention_seconds: float = setting(7 * 86400.0, "log age kept (0: unlimited)", metavar="S", min=0)
    max_header_bytes: int = setting(
        8192, "largest JSON header a client may send", metavar="BYTES", min=256, max=16 * MiB
    )
    max_payload_bytes: int = setting(
        16 * MiB,
        "largest payload a client may publish (also at most what fits a PSC link: max-message-size)",
        metavar="BYTES",
        min=1,
        max=1024 * MiB,
    )
    max_pending_bytes: int = setting(
        64 * MiB,
        "half-received headers and payloads of all stream connections together; past it ERROR 503 and close",
        metavar="BYTES",
        min=1024,
        max=2**40,
    )
    max_open_files: int = setting(
        128, "log segment files open at once, all topics together (an LRU)", metavar="N", min=1, max=1_000_000
    )
    max_topics: int = setting(
        10_000,
        "topics the stream log keeps at most; a new one past it gets ERROR 429",
        metavar="N",
        min=1,
        max=100_000_000,
    )
    max_disk_bytes: int = setting(
        10 * 1024 * MiB,
        "stream log on disk, all topics; oldest segments go first, then publishes get ERROR 507 (0: unlimited)",
        metavar="BYTES",
        min=0,
        max=2**60,
    )


@dataclass(frozen=True)
class SysVSection:
    """``[sysv]``: the System V message-queue front-end (docs/sysv.md)."""

    key: str | None = setting(
        None, "System V queue key, e.g. 0x420", flag="--sysv", metavar="KEY", shown_default="off", check=check_sysv_key
    )
    prefix: str = setting(
        "", "hub topic prefix of SysV channels", metavar="PREFIX", shown_default="none", check=check_prefix
    )
    max_users: int = setting(16, "logged-in users at most", metavar="N", min=1, max=100_000)
    max_channels: int = setting(16, "channels at most", metavar="N", min=1, max=100_000)
    max_subscriptions: int = setting(64, "subscriptions at most, all users together", metavar="N", min=1, max=100_000)
    max_blocks: int = setting(64, "blocks at most, all users together", metavar="N", min=1, max=100_000)
    client_queue_share: int = setting(
        64,
        "deliveries waiting in the queue for one client before further ones are dropped",
        metavar="N",
        min=1,
        max=100_000,
    )
    stray_grace: float = setting(
        2.0,
        "seconds a reply to a PID that is not logged in may wait for it; after that, and at once for PIDs the node"
        " never answered, messages on the queue for PIDs no logged-in client has are removed (checked every second)",
        metavar="S",
        min=0,
        max=3600,
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
        check=check_ws_url,
    )
    authid: str | None = setting(
        None,
        "authid the bridge authenticates as (with a ticket or WAMP-CRA secret)",
        flag="--authid",
        metavar="ID",
        shown_default="none: anonymous",
        check=check_text(1, 255),
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
        check=check_uri,
    )
    cluster_realm: str | None = setting(
        None,
        "the cluster realm the router's realm ([wamp] realm) is carried onto: its topics become that realm's"
        " topics in the cluster",
        flag="--cluster-realm",
        metavar="REALM",
        shown_default="the plain realm",
        check=check_realm,
    )
    lock: str = setting(
        "pubsubclub.bridge.active",
        "procedure the active bridge of a router registers (one bridge per router is active)",
        flag="--bridge-lock",
        metavar="URI",
        advanced=True,
        check=check_uri,
    )
    max_calls: int = setting(
        1000,
        "RPC calls in flight through the bridge, each way (router callers into the cluster, cluster callers"
        " into the router); one more gets ERROR pubsubclub.error.too_many_calls",
        metavar="N",
        min=1,
        max=1_000_000,
    )
