"""The whole configuration: :class:`NodeConfig` (one section per component), the section table, secrets.

``validate()`` checks every value against its declaration, then keeps only
the rules between settings (and the files they name).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from pubsubclub.config.clients import (
    BRIDGE_CRA_SECRET_ENV,
    BRIDGE_TICKET_ENV,
    BridgeSection,
    NSDSection,
    StreamSection,
    SysVSection,
    TEPSection,
    WampSection,
)
from pubsubclub.config.declare import ConfigError, Setting, binds_beyond_loopback
from pubsubclub.config.sections import ConsulSection, EdgeSection, FederationSection, MetricsSection, NodeSection

if TYPE_CHECKING:
    from pubsubclub.core.loginthrottle import LoginThrottleSettings
    from pubsubclub.frontends.wamp.auth import AuthPolicy


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


def declared() -> Iterator[Setting]:
    """Every setting, section by section, in declaration order."""
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            yield Setting(section, f.name, f)


_BY_ID = {s.id: s for s in declared()}
#: A setting's aliases (an earlier key of the same section, ``[wamp] realm``) find it too.
_BY_ID.update({f"{s.section}.{alias}" if s.section else alias: s for s in declared() for alias in s.aliases})
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
        """Return self, or raise :class:`ConfigError` naming the first bad key.

        Each value against its own declaration (bounds, choices, per-value rule), then the rules
        between settings and the files they name.
        """
        for s in declared():
            section = getattr(self, s.section or "node")
            s.check_value(getattr(section, s.attr))
        node, fed, consul, tep, edge = self.node, self.federation, self.consul, self.tep, self.edge
        if consul.url is not None and consul.check == "http" and node.http is None:
            raise ConfigError("consul-check", "http needs --http (the agent polls its /health)")
        if edge.idle_timeout and edge.ping_interval and edge.ping_interval >= edge.idle_timeout:
            raise ConfigError("edge-ping-interval", "must be shorter than edge-idle-timeout (or either 0)")
        if fed.reconnect_max < fed.reconnect_initial:
            raise ConfigError(
                "reconnect-max",
                f"must be at least reconnect-initial ({fed.reconnect_initial:g} s), not {fed.reconnect_max:g}",
            )
        for key, path in (
            ("cluster-secret-file", fed.cluster_secret_file),
            ("ca-file", fed.ca_file),
            ("tep-ops-token-file", tep.ops_token_file),
            ("ticket-file", self.bridge.ticket_file),
            ("cra-secret-file", self.bridge.cra_secret_file),
        ):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(key, f"no such file: {path}")
        self.cluster_secret()
        self.tep_ops_token()
        self.trust_root()
        self._check_realms()
        if self.bridge.router is not None:  # not a bridge: $PUBSUBCLUB_BRIDGE_* in a node's environment mean nothing
            ticket, secret = self.bridge_credentials()
            if (ticket is not None or secret is not None) and self.bridge.authid is None:
                raise ConfigError("authid", "a ticket or WAMP-CRA secret needs --authid")
        return self

    def _check_realms(self) -> None:
        """Realms listed once; a bridge joins one; the auth file's top level is the plain realm's."""
        realms = self.wamp.realms
        if not realms:
            raise ConfigError("realm", "lists no realm: a node serves at least one")
        if len(set(realms)) != len(realms):
            raise ConfigError("realm", f"a realm is listed twice: {', '.join(realms)}")
        if self.bridge.router is not None and len(realms) != 1:
            raise ConfigError("realm", "pubsubclub bridge joins one realm of its router: give --realm once")
        if self.bridge.cluster_realm is not None and self.wamp.plain_realm is None:
            raise ConfigError(
                "cluster-realm",
                "needs [wamp] plain-realm (--plain-realm), the cluster's plain realm: whether the cluster realm is"
                " the plain one decides its topics",
            )
        policy = self.auth_policy()
        if policy is not None and self.wamp.plain in policy.realms:
            raise ConfigError(
                "auth",
                f"{self.node.auth}: [realms.{self.wamp.plain}] names the plain realm, whose roles are the file's"
                " top level (NSD, TEP, stream and SysV clients share them); move them there",
            )

    def realm_warnings(self) -> tuple[str, ...]:
        """What an operator should hear about the realms: an implicit plain realm, realms nobody may join."""
        found: list[str] = []
        wamp = self.wamp
        if len(wamp.realms) > 1 and wamp.plain_realm is None:
            found.append(
                f"several realms and no [wamp] plain-realm: {wamp.realms[0]!r}, the first, is the plain realm;"
                " every node of the cluster must have the same one (links to nodes that disagree are refused),"
                " so set plain-realm on every node"
            )
        policy = self.auth_policy() if self.bridge.router is None else None
        if policy is not None:
            for realm in wamp.realms:
                if policy.for_realm(realm, wamp.plain) is None:
                    found.append(
                        f"{self.node.auth} has no [realms.{realm}] table: realm {realm!r} admits nobody"
                    )
        return tuple(found)

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

    def bridge_credentials(self) -> tuple[str | None, str | None]:
        """The bridge's router ticket and WAMP-CRA secret (files first, then the environment), each or None."""
        return bridge_credentials(self.bridge)

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
        return [key for key, value in self.listeners().items() if binds_beyond_loopback(value)]


def bridge_credentials(bridge: BridgeSection) -> tuple[str | None, str | None]:
    """The bridge's router ticket and WAMP-CRA secret (files first, then the environment), each or None."""
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
