"""The hot-path message types keep the frozen-dataclass contract without run-time setattr checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from mypy import api as mypy_api

from pubsubclub.core.hub import Envelope
from pubsubclub.federation.psc import Meta, Publish

HOT_TYPES = (Envelope, Meta, Publish)


@pytest.mark.parametrize("cls", HOT_TYPES, ids=lambda c: c.__name__)
def test_hot_types_are_slotted_dataclasses(cls: type) -> None:
    """Each is a dataclass with __slots__ and no per-instance __dict__ (no stray attributes)."""
    assert dataclasses.is_dataclass(cls)
    assert "__slots__" in vars(cls)
    instance = cls("t", 1) if cls is not Meta else cls()
    assert not hasattr(instance, "__dict__")
    with pytest.raises(AttributeError):
        instance.not_a_field = 1


def test_equality_and_hash_as_a_frozen_dataclass() -> None:
    """Equal by the compared fields (size and the encoding cache are not), hashable like a frozen dataclass."""
    a = Envelope("t", 1, "n", 1.5, "id", True, size=10)
    b = Envelope("t", 1, "n", 1.5, "id", True, size=99)
    b.wire["x"] = b"cached"
    assert a == b and hash(a) == hash(b)
    assert a != dataclasses.replace(a, payload=2)
    assert hash(Meta("o", 1.0, "i", False, 3)) == hash(Meta("o", 1.0, "i", False, 3))
    assert Publish("t", 1, Meta(seq=1)) == Publish("t", 1, Meta(seq=1))
    assert {Publish("t", 1): "x"}[Publish("t", 1)] == "x"


def test_each_envelope_gets_its_own_encoding_cache() -> None:
    """The memo dict is per instance, never shared through a default."""
    assert Envelope("t", 1).wire is not Envelope("t", 1).wire


def test_the_type_checker_rejects_assigning_a_field(tmp_path: Path) -> None:
    """Immutability is enforced by mypy (the project's code is checked strictly): every field assignment fails."""
    snippet = tmp_path / "assign.py"
    snippet.write_text(
        "from pubsubclub.core.hub import Envelope\n"
        "from pubsubclub.federation.psc import Meta, Publish\n"
        'Envelope("t", 1).topic = "x"\n'
        "Meta().seq = 1\n"
        'Publish("t", 1).meta = None\n'
    )
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nignore_missing_imports = True\n")
    out, err, status = mypy_api.run(
        ["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), str(snippet)]
    )
    assert status == 1, (out, err)
    for line, name in ((3, "topic"), (4, "seq"), (5, "meta")):
        assert f'assign.py:{line}: error: Property "{name}"' in out, out
