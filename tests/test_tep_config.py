"""TEP settings: flags, TOML keys and their validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from pubsubclub.cli.command import parser
from pubsubclub.config import ConfigError, build, load_toml, node_config


def test_flags_set_every_tep_setting() -> None:
    """--tep, --tep-prefix, --no-tep-client-publish and --tep-max-channels reach NodeConfig."""
    args = parser().parse_args(
        ["node", "--tep", "tcp:7100", "--tep-prefix", "t.", "--no-tep-client-publish", "--tep-max-channels", "5"]
    )
    config = node_config(args)
    assert (config.tep.listen, config.tep.prefix, config.tep.client_publish, config.tep.max_channels) == (
        "tcp:7100",
        "t.",
        False,
        5,
    )


def test_defaults_leave_tep_off() -> None:
    """Without flags TEP is off, unprefixed, open to client publishes, 100 channels per client."""
    config = node_config(parser().parse_args(["node"]))
    tep = config.tep
    assert (tep.listen, tep.prefix, tep.client_publish, tep.max_channels) == (None, "", True, 100)


def test_toml_keys(tmp_path: Path) -> None:
    """The TOML keys are typed: a string endpoint, a boolean and an integer."""
    path = tmp_path / "node.toml"
    path.write_text('tep = "tcp:7100"\ntep-client-publish = false\ntep_max_channels = 7\n')
    config = build(load_toml(str(path)), {})
    assert (config.tep.listen, config.tep.client_publish, config.tep.max_channels) == ("tcp:7100", False, 7)
    path.write_text('tep-client-publish = "no"\n')
    with pytest.raises(ConfigError, match="tep-client-publish"):
        load_toml(str(path))


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"tep": "nonsense:endpoint"}, "tep"),
        ({"tep_prefix": "$x."}, "tep-prefix"),
        ({"tep_prefix": "a b"}, "tep-prefix"),
        ({"tep_prefix": "x" * 129}, "tep-prefix"),
        ({"tep_max_channels": 0}, "tep-max-channels"),
    ],
)
def test_bad_values_name_the_key(values: dict[str, object], key: str) -> None:
    """A bad TEP value is refused with an error naming its key."""
    with pytest.raises(ConfigError) as e:
        build({}, values)
    assert e.value.key == key
