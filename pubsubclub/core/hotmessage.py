"""The class decorator for message types made once or more per message on the hot path.

Messages are frozen dataclasses (docs/architecture.md, "Frozen messages on
the hot path"). A ``@dataclass(frozen=True)`` enforces that at run time by
assigning every field in ``__init__`` through ``object.__setattr__``: about
1.1 us per envelope on the benchmark machine, a sixth of each node's CPU per
cross-node message. :func:`hot_message` builds the same dataclass (fields,
defaults, ``__eq__``, ``__hash__``, ``__repr__``, ``dataclasses.replace``)
with ``__slots__`` and a plain ``__init__`` (about a fifth of that cost), and
tells the type checker that it is frozen: mypy rejects any assignment to a
field, so immutability is enforced where the code is checked, not at run
time (``tests/test_hotmessage.py`` holds the rest of the contract).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def hot_message(cls: type[T]) -> type[T]:
    """A frozen-by-type-checker dataclass with slots, equality and the hash a frozen one has."""
    made: Any = dataclass(slots=True, unsafe_hash=True)(cls)
    return made  # type: ignore[no-any-return]
