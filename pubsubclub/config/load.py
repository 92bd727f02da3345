"""Loading a configuration: the TOML file (sections, or the flat keys of earlier versions), the flags, and both.

The flat keys of earlier versions (``consul-ttl = 5`` at the top level) still
load, each with a deprecation warning naming its new place.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from pubsubclub.config.declare import ConfigError, Setting
from pubsubclub.config.model import _BY_ID, _BY_LEGACY, SECTIONS, NodeConfig, declared

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
                    names = ", ".join((found.key, *found.aliases)) if found.aliases else ""
                    names = f", or as two of its names: {names}" if names else ""
                    raise ConfigError(found.id, f"set twice in {path} (flat and in [{found.section}]{names})")
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
    keys = sorted({s.key for s in _BY_ID.values() if s.section == section})
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
        if isinstance(value, str):
            return (value,)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(name, "must be a list of strings (or one string)")
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
    elif found.field.metadata.get("toml_int") and type(value) is int:
        value = str(value)  # e.g. workers = 4 (the setting also takes "auto")
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
            if isinstance(value, str) and "tuple" in found.kind:
                value = (value,)  # one value of a list setting (``realm="r"``)
            merged[found.section][found.attr] = value
    sections = {section or "node": replace(cls(), **merged[section]) for section, cls in SECTIONS.items()}
    config = NodeConfig(**sections, warnings=warnings).validate()
    hints = tuple(peer_path_hint(url) for url in config.federation.peers if urlsplit(url).path != PSC_PATH)
    hints += config.realm_warnings()
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
BRIDGE_EXTRA = ("wamp.realms", "wamp.plain-realm")
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
