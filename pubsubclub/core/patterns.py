"""Pattern interest: WAMP prefix and wildcard matching over hub topics, and an index to match fast.

A :class:`Pattern` is what a WAMP ``match: "prefix"`` or ``match:
"wildcard"`` subscription becomes in the hub (after the broker's realm
mapping), and what PSC 0.5 carries between nodes (PSC203/PSC204), so its
meaning is one cluster-wide rule, defined here and in docs/protocol.md:

* ``prefix``: the topic starts with the pattern (a plain string prefix, as
  in WAMP: ``com.app.`` matches ``com.app.x.y``, ``com.app`` also matches
  ``com.apple``).
* ``wildcard``: a topic's *scope* is everything up to and including its last
  ``#`` (empty when it has none; the broker's other realms live under
  ``$realm.<realm>#``). Topic and pattern must have the same scope and, after
  it, the same number of ``.``-separated components; a non-empty pattern
  component must equal the topic's, an empty one matches any one component
  that is not empty and does not start with ``$`` (the cluster's reserved
  topics are never caught by a wildcard).

:class:`PatternIndex` maps patterns to their holders (hub sinks, PSC
streams) and answers "which patterns match this topic" without scanning
every pattern: prefixes are looked up by length (one dict probe per distinct
prefix length), wildcards in a component trie per (scope, component count),
and answers are cached per topic (bounded, dropped when the patterns change).
No Twisted here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

PREFIX = "prefix"
WILDCARD = "wildcard"
#: The pattern kinds, as WAMP and PSC 0.5 name them.
MATCHES = (PREFIX, WILDCARD)

#: Topics whose matches a :class:`PatternIndex` remembers; past it the oldest answer is dropped.
DEFAULT_CACHE_SIZE = 4096

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pattern:
    """One pattern over hub topics: ``match`` is ``"prefix"`` or ``"wildcard"``."""

    match: str
    pattern: str

    def __post_init__(self) -> None:
        if self.match not in MATCHES:
            raise ValueError(f"Pattern match must be 'prefix' or 'wildcard', not {self.match!r}")

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` matches (the rule in the module docstring)."""
        if self.match == PREFIX:
            return topic.startswith(self.pattern)
        scope, rest = split_scope(self.pattern)
        topic_scope, topic_rest = split_scope(topic)
        if scope != topic_scope:
            return False
        wanted = rest.split(".")
        got = topic_rest.split(".")
        return len(wanted) == len(got) and all(
            w == g if w else (g != "" and g[0] != "$") for w, g in zip(wanted, got, strict=True)
        )

    @property
    def head(self) -> str:
        """The literal start every matching topic has (for prefix-based permissions)."""
        if self.match == PREFIX:
            return self.pattern
        scope, rest = split_scope(self.pattern)
        literal: list[str] = []
        for component in rest.split("."):
            if not component:
                return scope + "".join(literal)
            literal.append(component + ".")
        return self.pattern


def split_scope(topic: str) -> tuple[str, str]:
    """``(scope, rest)``: the scope is everything up to and including the last ``#``."""
    cut = topic.rfind("#") + 1
    return topic[:cut], topic[cut:]


def pattern_problem(match: object, pattern: object, max_length: int) -> str | None:
    """Why ``(match, pattern)`` is not a pattern a peer may send, or None if it is one."""
    if match not in MATCHES:
        return f"pattern match must be 'prefix' or 'wildcard', got {str(match)[:40]!r}"
    if not isinstance(pattern, str):
        return f"pattern must be a string, got {type(pattern).__name__}"
    if not pattern:
        return "pattern must not be empty"
    if len(pattern) > max_length:
        return f"pattern of {len(pattern)} characters is over the limit of {max_length}"
    return None


@dataclass(eq=False, slots=True)
class _Node:
    """A wildcard trie node: children by component ("" is the wildcard), the pattern ending here."""

    children: dict[str, _Node] = field(default_factory=dict)
    pattern: Pattern | None = None


class PatternIndex(Generic[T]):
    """Patterns -> their holders, matched against topics without a scan of every pattern."""

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._holders: dict[Pattern, dict[T, None]] = {}
        #: prefix length -> prefix -> its pattern.
        self._prefixes: dict[int, dict[str, Pattern]] = {}
        #: (scope, component count) -> trie of wildcard components.
        self._wildcards: dict[tuple[str, int], _Node] = {}
        self._cache: dict[str, tuple[Pattern, ...]] = {}
        self._cache_size = cache_size

    def __len__(self) -> int:
        return len(self._holders)

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._holders

    def patterns(self) -> list[Pattern]:
        """Every pattern with at least one holder."""
        return list(self._holders)

    def holders(self, pattern: Pattern) -> dict[T, None]:
        """The holders of ``pattern`` (empty when nobody holds it)."""
        return self._holders.get(pattern, {})

    def add(self, pattern: Pattern, holder: T) -> bool:
        """Add ``holder`` to ``pattern``; True when the pattern is new. Idempotent."""
        holders = self._holders.get(pattern)
        if holders is not None:
            holders[holder] = None
            return False
        self._holders[pattern] = {holder: None}
        if pattern.match == PREFIX:
            self._prefixes.setdefault(len(pattern.pattern), {})[pattern.pattern] = pattern
        else:
            scope, rest = split_scope(pattern.pattern)
            components = rest.split(".")
            node = self._wildcards.setdefault((scope, len(components)), _Node())
            for component in components:
                node = node.children.setdefault(component, _Node())
            node.pattern = pattern
        self._cache.clear()
        return True

    def discard(self, pattern: Pattern, holder: T) -> bool:
        """Remove ``holder`` from ``pattern``; True when that was its last holder. Idempotent."""
        holders = self._holders.get(pattern)
        if holders is None or holder not in holders:
            return False
        del holders[holder]
        if holders:
            return False
        del self._holders[pattern]
        if pattern.match == PREFIX:
            by_length = self._prefixes[len(pattern.pattern)]
            del by_length[pattern.pattern]
            if not by_length:
                del self._prefixes[len(pattern.pattern)]
        else:
            self._forget_wildcard(pattern)
        self._cache.clear()
        return True

    def _forget_wildcard(self, pattern: Pattern) -> None:
        scope, rest = split_scope(pattern.pattern)
        components = rest.split(".")
        key = (scope, len(components))
        path = [self._wildcards[key]]
        for component in components:
            path.append(path[-1].children[component])
        path[-1].pattern = None
        # Prune the branch back up to the first node something else still needs.
        for depth in range(len(components), 0, -1):
            node = path[depth]
            if node.children or node.pattern is not None:
                break
            del path[depth - 1].children[components[depth - 1]]
        if not path[0].children:
            del self._wildcards[key]

    def match(self, topic: str) -> tuple[Pattern, ...]:
        """Every pattern that matches ``topic`` (cached per topic until the patterns change)."""
        if not self._holders:
            return ()
        cache = self._cache
        found = cache.get(topic)
        if found is not None:
            return found
        matched: list[Pattern] = []
        length = len(topic)
        for size, prefixes in self._prefixes.items():
            if size <= length:
                hit = prefixes.get(topic[:size])
                if hit is not None:
                    matched.append(hit)
        if self._wildcards:
            self._match_wildcards(topic, matched)
        found = tuple(matched)
        if len(cache) >= self._cache_size:
            del cache[next(iter(cache))]
        cache[topic] = found
        return found

    def _match_wildcards(self, topic: str, matched: list[Pattern]) -> None:
        scope, rest = split_scope(topic)
        components = rest.split(".")
        root = self._wildcards.get((scope, len(components)))
        if root is None:
            return
        frontier = [root]
        for component in components:
            if not component:
                return
            step = []
            for node in frontier:
                exact = node.children.get(component)
                if exact is not None:
                    step.append(exact)
                if component[0] != "$":
                    any_one = node.children.get("")
                    if any_one is not None:
                        step.append(any_one)
            if not step:
                return
            frontier = step
        matched.extend(node.pattern for node in frontier if node.pattern is not None)
