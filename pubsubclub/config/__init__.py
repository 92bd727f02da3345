"""Node configuration: one declaration per setting, nested in sections, validated once.

Every setting is a field of a section dataclass, declared with
:func:`~pubsubclub.config.declare.setting`: its default, its help text, its
command-line flag and its valid values (``min``/``max``, ``choices``, a
per-value ``check``). From that one declaration come the TOML key
(``[section] key``, or a top-level key for :class:`NodeSection`), the
``pubsubclub node`` flag with its ``--help`` line and default
(:func:`add_flags`), the type check of TOML values, the value check and the
docs table. Adding a setting is adding one field.

- :mod:`.declare`: ``setting()``, :class:`Setting`, :class:`ConfigError`, per-value checks
- :mod:`.sections`: the node-wide sections (node, federation, consul, edge, metrics)
- :mod:`.clients`: the front-ends' sections (wamp, nsd, tep, stream, sysv, bridge)
- :mod:`.model`: :class:`NodeConfig` (cross-field rules), the section table, secret files
- :mod:`.load`: TOML, flags, the deprecated flat keys, the command line
- :mod:`.reference`: the table in docs/configuration.md
"""

from pubsubclub.config.clients import (
    BRIDGE_CRA_SECRET_ENV,
    BRIDGE_ROLE,
    BRIDGE_TICKET_ENV,
    BridgeSection,
    NSDSection,
    StreamSection,
    SysVSection,
    TEPSection,
    WampSection,
)
from pubsubclub.config.declare import ConfigError, MiB, Setting, binds_beyond_loopback, setting
from pubsubclub.config.load import (
    BRIDGE_EXTRA,
    BRIDGE_SECTIONS,
    BRIDGE_UNUSED,
    PSC_PATH,
    FileValues,
    add_flags,
    add_node_flags,
    bridge_setting,
    build,
    flag_values,
    load_toml,
    node_config,
    node_setting,
    peer_path_hint,
)
from pubsubclub.config.model import (
    MAX_SECRET_FILE,
    SECTIONS,
    NodeConfig,
    bridge_credentials,
    declared,
    read_cluster_secret,
)
from pubsubclub.config.reference import reference_markdown
from pubsubclub.config.sections import (
    CONSUL_CHECKS,
    LISTEN_ROLES,
    LOG_LEVELS,
    ConsulSection,
    EdgeSection,
    FederationSection,
    MetricsSection,
    NodeSection,
)

__all__ = [
    "BRIDGE_CRA_SECRET_ENV",
    "BRIDGE_EXTRA",
    "BRIDGE_ROLE",
    "BRIDGE_SECTIONS",
    "BRIDGE_TICKET_ENV",
    "BRIDGE_UNUSED",
    "CONSUL_CHECKS",
    "LISTEN_ROLES",
    "LOG_LEVELS",
    "MAX_SECRET_FILE",
    "PSC_PATH",
    "SECTIONS",
    "BridgeSection",
    "ConfigError",
    "ConsulSection",
    "EdgeSection",
    "FederationSection",
    "FileValues",
    "MetricsSection",
    "MiB",
    "NSDSection",
    "NodeConfig",
    "NodeSection",
    "Setting",
    "StreamSection",
    "SysVSection",
    "TEPSection",
    "WampSection",
    "add_flags",
    "add_node_flags",
    "binds_beyond_loopback",
    "bridge_credentials",
    "bridge_setting",
    "build",
    "declared",
    "flag_values",
    "load_toml",
    "node_config",
    "node_setting",
    "peer_path_hint",
    "read_cluster_secret",
    "reference_markdown",
    "setting",
]
