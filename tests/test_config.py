"""The one declaration of settings: flags, TOML keys, help, sections, deprecated flat keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pubsubclub.cli.command import parser
from pubsubclub.config import (
    SECTIONS,
    ConfigError,
    NodeConfig,
    Setting,
    bridge_setting,
    build,
    declared,
    load_toml,
    node_config,
    node_setting,
    reference_markdown,
)

REPO = Path(__file__).resolve().parent.parent


def node_help(command: str = "node") -> str:
    """``pubsubclub node --help`` (or another command's), whitespace collapsed."""
    node_parser = parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return " ".join(node_parser.format_help().split())


def command_of(s: Setting) -> str:
    """The command that takes setting ``s``: ``bridge`` for the bridge's own, else ``node``."""
    return "node" if node_setting(s) else "bridge"


def test_every_setting_has_a_flag_a_toml_key_and_a_help_line_with_its_default() -> None:
    """Each declared setting appears in --help with text, its default and its TOML place; flags are unique."""
    texts = {command: node_help(command) for command in ("node", "bridge")}
    flags = [s.flag for s in declared()]
    assert len(flags) == len(set(flags))
    for s in declared():
        if s.field.metadata.get("advanced"):
            continue
        offered = {command: re.search(rf"\[{s.flag}[ \]]", text) is not None for command, text in texts.items()}
        assert offered[command_of(s)], s.id
        assert offered["bridge"] == bridge_setting(s), s.id
        assert f"TOML: {s.toml_name()}" in " ".join(s.help_text().split()), s.id
        assert "(default: " in s.help_text() and s.field.metadata["help"], s.id


def test_log_level_and_chat_page_have_toml_keys(tmp_path: Path) -> None:
    """The two flags that once had no TOML key: log-level and [wamp] chat-page."""
    path = tmp_path / "node.toml"
    path.write_text('log-level = "warn"\n[wamp]\nchat-page = false\n')
    config = build(load_toml(str(path)), {})
    assert (config.node.log_level, config.wamp.chat_page) == ("warn", False)
    assert load_toml(str(path)).warnings == ()


def test_every_setting_round_trips_through_toml_and_flags(tmp_path: Path) -> None:
    """For every setting: its section key in TOML and its flag on the command line set the same field."""
    samples = {"str": "x", "int": 7, "float": 2.5, "bool": False}
    for s in declared():
        kind = s.kind.split(" ")[0]
        if "tuple" in s.kind:
            toml_value, value = '["ws://127.0.0.1:9/psc"]', ("ws://127.0.0.1:9/psc",)
        elif kind == "bool":
            toml_value, value = "false" if s.default else "true", not s.default
        elif kind in ("int", "float"):
            toml_value, value = str(samples[kind]), samples[kind]
        elif s.field.metadata.get("choices"):
            value = s.field.metadata["choices"][-1]
            toml_value = f'"{value}"'
        else:
            toml_value, value = '"x"', "x"
        line = f"{s.key} = {toml_value}\n"
        path = tmp_path / "t.toml"
        path.write_text(line if not s.section else f"[{s.section}]\n{line}")
        loaded = load_toml(str(path))
        assert loaded.values == {s.id: value}, s.id
        one = value[0] if isinstance(value, tuple) else value
        argv = [command_of(s), s.flag] if kind == "bool" else [command_of(s), s.flag, str(one)]
        args = parser().parse_args(argv)
        assert getattr(args, s.dest) in (value, [value[0]] if isinstance(value, tuple) else value), s.id


def test_sections_are_handed_whole(tmp_path: Path) -> None:
    """A nested file fills each section's dataclass; flags override single fields."""
    path = tmp_path / "node.toml"
    path.write_text(
        'name = "n1"\n[wamp]\nrealm = "r"\n'
        '[federation]\npeers = ["ws://127.0.0.1:9002/psc"]\nlisten-role = "consumer"\n'
        '[consul]\nttl = 5\n[nsd]\nprefix = "nsd."\n[tep]\nmax-channels = 3\n[metrics]\nmax-topics = 9\n'
    )
    config = build(load_toml(str(path)), {"realm": "flag-wins"})
    assert config.node.name == "n1" and config.wamp.realm == "flag-wins"
    assert config.federation.peers == ("ws://127.0.0.1:9002/psc",) and config.federation.listen_role == "consumer"
    assert (config.consul.ttl, config.nsd.prefix, config.tep.max_channels, config.metrics.max_topics) == (
        5.0,
        "nsd.",
        3,
        9,
    )
    assert set(SECTIONS) - {""} == {name for name in vars(config) if name not in ("node", "warnings")}


def test_flat_keys_still_load_with_a_deprecation_warning(tmp_path: Path) -> None:
    """consul-ttl = 5 at the top level sets [consul] ttl and says where it belongs now."""
    path = tmp_path / "node.toml"
    path.write_text('consul-ttl = 5\nwamp = "tcp:8089"\npeer = ["ws://127.0.0.1:9002/psc"]\nname = "n"\n')
    loaded = load_toml(str(path))
    config = build(loaded, {})
    assert (config.consul.ttl, config.wamp.listen, config.federation.peers) == (5.0, "tcp:8089", ("ws://127.0.0.1:9002/psc",))
    assert len(config.warnings) == 3  # name is a top-level key, not deprecated
    assert any("'consul-ttl' is deprecated; write it as [consul] ttl" in w for w in config.warnings)
    assert any("'wamp' is deprecated; write it as [wamp] listen" in w for w in config.warnings)


def test_flat_and_nested_together_is_an_error(tmp_path: Path) -> None:
    """The same setting flat and in its section: an error naming it."""
    path = tmp_path / "node.toml"
    path.write_text("consul-ttl = 5\n[consul]\nttl = 6\n")
    with pytest.raises(ConfigError, match="set twice"):
        load_toml(str(path))


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[consul]\nnope = 1\n", "consul.nope"),
        ("nope = 1\n", "nope"),
        ('[metrics]\nmax-topics = "many"\n', "metrics.max-topics"),
        ("[wamp]\nchat-page = 1\n", "wamp.chat-page"),
    ],
)
def test_bad_keys_and_values_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    """Unknown keys (flat or in a section) and wrongly typed values name the key."""
    path = tmp_path / "node.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_toml(str(path))
    assert e.value.key == key


def test_defaults_build_and_validate() -> None:
    """No file, no flags: the declared defaults, valid."""
    config = node_config(parser().parse_args(["node"]))
    assert config == NodeConfig()
    assert config.wamp.listen == "tcp:8080:interface=127.0.0.1" and config.federation.listen_role == "producer"


def test_configuration_doc_lists_every_setting() -> None:
    """docs/configuration.md holds the table generated from the declarations, unchanged, and no other setting rows.

    A stale copy of rows (e.g. left by a merge) would document a setting twice, possibly with an old default.
    """
    doc = (REPO / "docs" / "configuration.md").read_text()
    table = reference_markdown()
    assert table in doc
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    assert sorted(rows) == sorted(line for line in table.splitlines() if line.startswith("| `"))


@pytest.mark.parametrize("key", ["nsd_prefix", "tep_prefix", "stream_prefix", "sysv_prefix"])
def test_topic_prefixes_cannot_reach_reserved_topics(key: str) -> None:
    """A front-end's prefix starting with $ would map its channels onto the cluster's reserved topics."""
    with pytest.raises(ConfigError) as e:
        build({}, {key: "$nsd."})
    assert e.value.key == key.replace("_", "-")
