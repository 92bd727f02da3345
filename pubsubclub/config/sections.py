"""The sections of a node's configuration: one frozen dataclass per component, one :func:`setting` per key.

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
    check_http_url,
    check_text,
    check_workers,
    check_ws_url,
    setting,
)
from pubsubclub.core.dumpfile import DUMP_FORMATS

LISTEN_ROLES = ("producer", "consumer")
CONSUL_CHECKS = ("ttl", "http")
LOG_LEVELS = ("debug", "info", "warn", "error")


@dataclass(frozen=True)
class NodeSection:
    """Top-level keys: the node as a whole."""

    name: str | None = setting(
        None,
        "node id, unique in the cluster",
        metavar="NAME",
        shown_default="a random id",
        check=check_text(1, 128, spaces=False),
    )
    data_dir: str = setting("pubsubclub-data", "folder for the node's stores", metavar="DIR", check=check_text(1, 4096))
    http: str | None = setting(
        None,
        "operations listener: /health, /stats, /metrics, /tep (keep it private)",
        metavar="ENDPOINT",
        shown_default="off",
        check=check_endpoint,
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
        min=1,
        max=10_000_000,
    )
    auth_failure_delay: float = setting(
        1.0,
        "first lockout after those failures, in seconds; each further failure doubles it",
        metavar="S",
        min=0,
        max=86_400,
    )
    auth_max_delay: float = setting(
        60.0, "longest lockout after failed logins, in seconds", metavar="S", min=0, max=86_400
    )
    auth_failure_memory: float = setting(
        600.0,
        "a source address with no failed login for this long starts again from zero, in seconds",
        metavar="S",
        min=0,
        max=86_400,
    )
    auth_max_sources: int = setting(
        10_000,
        "source addresses whose failed logins are remembered (IPv6 per /64); past it the oldest go",
        metavar="N",
        min=1,
        max=10_000_000,
    )
    max_message_size: int = setting(
        MiB, "largest WAMP, PSC or TEP message accepted, in bytes", metavar="BYTES", min=1024, max=64 * MiB
    )
    max_send_buffer: int = setting(
        16 * MiB,
        "a WAMP or TEP client with more unread is dropped as a slow consumer",
        metavar="BYTES",
        min=65_536,
        max=2**40,
    )
    max_json_depth: int = setting(
        64, "deepest array/object nesting any client or peer may send", metavar="N", min=2, max=200
    )
    max_subscribed_topics: int = setting(
        100_000,
        "topics with subscribers on this node at most, all front-ends together; a client's subscribe to one more"
        " gets an error",
        metavar="N",
        min=1,
        max=10_000_000,
    )
    shutdown_timeout: float = setting(
        5.0,
        "longest a graceful stop (SIGINT/SIGTERM) may take before the node exits anyway, in seconds",
        metavar="S",
        min=0.1,
        max=3600,
    )
    gc_refreeze: bool = setting(
        True,
        "freeze what survives each full cyclic-GC collection (gc.freeze), so the next walks only newer objects:"
        " no reactor stall that grows with the sessions held; off: frozen once at start-up"
        " (docs/architecture.md, Closed connections and the cyclic collector)",
        advanced=True,
    )
    gc_full_threshold: int = setting(
        1,
        "Python's third cyclic-GC threshold (gc.set_threshold): a full collection waits for this many"
        " collections of the middle generation (Python's default: 10); with gc-refreeze each walks only what"
        " came since the last, so 1 keeps every walk short",
        metavar="N",
        min=1,
        max=1000,
        advanced=True,
    )
    gc_thaw_growth: float = setting(
        2.0,
        "with gc-refreeze: once the frozen objects pass this many times their count after the last thaw"
        " (checked each minute), unfreeze and collect everything once, freeing cycles among frozen objects"
        " (a bounded leak; one long collection); 0: never",
        metavar="X",
        min=0,
        max=1000,
        advanced=True,
    )
    workers: str = setting(
        "1",
        "worker processes behind the client listeners (WAMP, RawSocket, TEP), one node to the cluster;"
        " auto: one per core (docs/architecture.md, Workers)",
        metavar="N|auto",
        check=check_workers,
        toml_int=True,
    )
    worker_max_restarts: int = setting(
        5,
        "with --workers above 1: crashed workers restarted per minute at most (each after a growing delay);"
        " past it the node stops with an error",
        metavar="N",
        min=0,
        max=1000,
    )


@dataclass(frozen=True)
class FederationSection:
    """``[federation]``: links to the other nodes (PSC)."""

    listen: str | None = setting(
        "tcp:9001:interface=127.0.0.1",
        "federation listener, path /psc",
        flag="--psc",
        metavar="ENDPOINT",
        check=check_endpoint,
    )
    peers: tuple[str, ...] = setting(
        (),
        "PSC URL of another node, e.g. ws://127.0.0.1:9002/psc (repeatable)",
        flag="--peer",
        metavar="URL",
        check=check_ws_url,
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
        check=check_ws_url,
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
        min=0.1,
        max=3600,
    )
    max_pending_proofs: int = setting(
        256,
        "with a secret: links answered but not yet proven, at most; past it the oldest of the biggest holder goes",
        flag="--max-pending-proofs",
        metavar="N",
        min=1,
        max=1_000_000,
    )
    max_pending_proofs_per_address: int = setting(
        16,
        "with a secret: of those, at most N from one address; past it that address's oldest goes",
        flag="--max-pending-proofs-per-address",
        metavar="N",
        min=1,
        max=1_000_000,
    )
    ca_file: str | None = setting(
        None,
        "CA certificates that wss:// peers are verified against",
        flag="--ca-file",
        metavar="PEM",
        shown_default="the system's",
    )
    replay_buffer_bytes: int = setting(
        16 * MiB,
        "PSC 0.3 replay buffer per consumer node",
        flag="--replay-buffer-bytes",
        metavar="BYTES",
        min=65_536,
        max=2**40,
    )
    replay_window_seconds: float = setting(
        60.0,
        "a dropped link back within S seconds loses nothing (0: extension off)",
        flag="--replay-window-seconds",
        metavar="S",
        min=0,
        max=86_400,
    )
    max_link_queue: int = setting(
        16 * MiB,
        "a PSC link with more queued for its peer is dropped",
        flag="--max-link-queue",
        metavar="BYTES",
        min=65_536,
        max=2**40,
    )
    link_headroom: int = setting(
        64 * 1024,
        "a link frame may hold --max-message-size plus this: room for a PSC301's topic and metadata;"
        " publishes that would not fit are refused before they are acknowledged",
        flag="--link-headroom",
        metavar="BYTES",
        min=16 * 1024,
        max=64 * MiB,
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
    reconnect_initial: float = setting(
        1.0,
        "seconds before redialling a peer whose link failed or dropped (spread by a fifth either way);"
        " each further failure waits 1.5 times longer, up to --reconnect-max",
        flag="--reconnect-initial",
        metavar="S",
        min=0.05,
        max=60,
    )
    reconnect_max: float = setting(
        10.0,
        "longest wait between redials of a peer (at least --reconnect-initial)",
        flag="--reconnect-max",
        metavar="S",
        min=0.05,
        max=3600,
    )
    max_patterns_per_peer: int = setting(
        10_000,
        "patterns (WAMP prefix/wildcard) this node holds at most, a SUBSCRIBE of one more gets an ERROR;"
        " a peer announcing more is disconnected",
        flag="--max-patterns-per-peer",
        metavar="N",
        min=1,
        max=1_000_000,
    )


@dataclass(frozen=True)
class ConsulSection:
    """``[consul]``: discovery through the local Consul agent."""

    url: str | None = setting(
        None,
        "Consul agent URL, e.g. http://127.0.0.1:8500",
        flag="--consul",
        metavar="URL",
        shown_default="off",
        check=check_http_url,
    )
    service: str = setting(
        "pubsubclub",
        "Consul service name the nodes register under",
        flag="--service",
        metavar="NAME",
        check=check_text(1, 128),
    )
    token: str | None = setting(None, "Consul ACL token", metavar="TOKEN", shown_default="none")
    dc: str | None = setting(None, "Consul datacenter", metavar="DC", shown_default="the agent's")
    check: str = setting("ttl", "health check: ttl heartbeats, or http polls of /health", choices=CONSUL_CHECKS)
    ttl: float = setting(
        10.0, "seconds the TTL check lives without a heartbeat", metavar="SECONDS", min=0.3, max=86_400
    )
    debounce: float = setting(
        0.5, "seconds of quiet before a membership change applies", metavar="S", advanced=True, min=0, max=60
    )
    retry_initial: float = setting(
        0.5,
        "seconds before retrying a failed request to the Consul agent (registration, heartbeat, watch)",
        metavar="S",
        advanced=True,
        min=0.01,
        max=3600,
    )
    retry_factor: float = setting(
        2.0, "growth of that delay per further failure", metavar="X", advanced=True, min=1.0, max=10.0
    )
    retry_max: float = setting(
        15.0,
        "longest delay between retries to the Consul agent, in seconds",
        metavar="S",
        advanced=True,
        min=0.01,
        max=3600,
    )
    retry_jitter: float = setting(
        0.2,
        "spread of each retry delay, as a fraction either way (nodes failing together do not retry together)",
        metavar="F",
        advanced=True,
        min=0.0,
        max=0.9,
    )
    watch_wait: float = setting(
        60.0,
        "longest a blocking query for the service's members waits at the agent, in seconds (Consul caps it at 600)",
        metavar="S",
        advanced=True,
        min=1.0,
        max=600.0,
    )
    deregister_after: float = setting(
        600.0,
        "the agent removes this node's service once its check has been critical this long, in seconds"
        " (Consul's DeregisterCriticalServiceAfter; at least 60)",
        metavar="S",
        advanced=True,
        min=60.0,
        max=604_800.0,
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
        min=0.1,
        max=86_400,
    )
    idle_timeout: float = setting(
        30.0,
        "seconds without a byte received before a connection is closed, after its handshake, on the listeners"
        " that ping (WAMP WebSocket and RawSocket, TEP, PSC) and the ops listener (0: never)",
        metavar="S",
        min=0,
        max=86_400,
    )
    ping_interval: float = setting(
        10.0,
        "seconds of quiet after which WAMP (WebSocket and RawSocket) and TEP clients are pinged; a client that"
        " answers is never idle (0: no pings)",
        metavar="S",
        min=0,
        max=86_400,
    )
    nsd_idle_timeout: float = setting(
        0.0,
        "idle timeout of NSD clients after their first request (NSD has no keepalive; 0: never)",
        metavar="S",
        min=0,
        max=86_400,
    )
    stream_idle_timeout: float = setting(
        0.0,
        "idle timeout of stream clients after Connect (no keepalive in the protocol; 0: never)",
        metavar="S",
        min=0,
        max=86_400,
    )
    max_per_address: int = setting(
        1000,
        "open connections one source address may hold on one listener; more are refused (with --workers: on the"
        " whole node, each worker holding its share)",
        metavar="N",
        min=0,
        max=10_000_000,
    )
    max_connections: int = setting(
        10_000,
        "open connections on one listener; more are refused (with --workers: on the whole node, each worker"
        " holding its share)",
        metavar="N",
        min=0,
        max=10_000_000,
    )
    max_partial_input: int = setting(
        64 * MiB,
        "bytes of unfinished lines, frames and headers all connections together may hold; past it the largest"
        " holders are closed (0: no budget)",
        metavar="BYTES",
        min=0,
        max=2**40,
    )
    log_interval: float = setting(
        10.0,
        "seconds between log lines summing refused or closed connections",
        metavar="S",
        advanced=True,
        min=0.1,
        max=86_400,
    )


@dataclass(frozen=True)
class MetricsSection:
    """``[metrics]``: dumps and the Prometheus scrape."""

    dir: str | None = setting(None, "write metrics dumps here (docs/metrics.md)", metavar="DIR", shown_default="off")
    interval: float = setting(10.0, "seconds between metrics dumps", metavar="S", min=0.05, max=86_400)
    max_topics: int = setting(
        200, "topics with their own /metrics series; the rest summed as __other__", metavar="N", min=1, max=100_000
    )
    dump_format: str = setting(
        "jsonl",
        "file format of the metrics dumps: JSON lines, Parquet (needs pyarrow: the parquet extra), or both",
        choices=DUMP_FORMATS,
    )
    merge_hours: bool = setting(
        True, "merge each closed hour's Parquet dumps of the node into one file (docs/metrics.md)"
    )
