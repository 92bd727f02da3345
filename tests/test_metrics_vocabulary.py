"""Metrics call sites use the enums of core/counters.py, and the node hands one Metrics down to every part."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from twisted.internet.task import Clock

import pubsubclub
from pubsubclub.config import NodeConfig
from pubsubclub.core.counters import Kind, Source
from pubsubclub.core.hub import Hub
from pubsubclub.core.metrics import Metrics
from pubsubclub.federation.federation import Federation
from pubsubclub.node.node import Node

PACKAGE = Path(pubsubclub.__file__).parent
#: Metrics method -> positions (and keywords) of the arguments that must be an enum, never a str literal.
ENUM_ARGUMENTS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "count": ((1, 2, 6), ("frontend", "kind", "reason")),
    "event": ((0,), ("event",)),
    "error": ((0,), ("component",)),
    "disconnect": ((0,), ("frontend",)),
    "link_count": ((1,), ("kind",)),
    "view": ((), ()),
}


def _is_str_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.IfExp):
        return _is_str_literal(node.body) or _is_str_literal(node.orelse)
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _metrics_receiver(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("metrics", "_metrics")) or (
        isinstance(node, ast.Attribute) and node.attr in ("metrics", "_metrics")
    )


def literal_call_sites(source: str, where: str = "<source>") -> list[str]:
    """Every metrics call (and ``counts_as``) in ``source`` with a string literal where an enum belongs."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "counts_as" for t in node.targets):
            if _is_str_literal(node.value):
                found.append(f"{where}:{node.lineno}: counts_as = a string")
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if not _metrics_receiver(node.func.value) or node.func.attr not in ENUM_ARGUMENTS:
            continue
        positions, keywords = ENUM_ARGUMENTS[node.func.attr]
        args = [a for i, a in enumerate(node.args) if i in positions]
        args += [k.value for k in node.keywords if k.arg in keywords]
        if any(_is_str_literal(a) for a in args):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_metrics_call_in_the_package_passes_a_string_literal_for_an_enum() -> None:
    """Front-end, kind, drop reason, component and link-count kind are enums at every call site of pubsubclub/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("metrics.py", "counters.py") and path.parent.name == "core":
            continue
        found += literal_call_sites(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    assert found == [], "use the enums of pubsubclub/core/counters.py:\n" + "\n".join(found)


def test_the_vocabulary_check_catches_a_literal() -> None:
    """The check above finds a literal front-end, kind or reason, and passes the enums."""
    bad = 'hub.metrics.count(t, "psc", Kind.RECEIVED)\nself._metrics.count(t, Source.TEP, Kind.DROPPED, reason="x")\n'
    bad += 'metrics.error("sysv", "why")\nclass S:\n    counts_as = "wamp"\n'
    assert len(literal_call_sites(bad)) == 4
    good = "hub.metrics.count(t, Source.PSC, Kind.RECEIVED, reason=DropReason.BOUNDS)\nmetrics.error(Source.SYSV, r)\n"
    assert literal_call_sites(good) == []


def test_mypy_refuses_a_string_where_metrics_take_an_enum(tmp_path: Path) -> None:
    """Metrics.count is typed with the enums: mypy rejects ``"psc"`` and accepts ``Source.PSC``."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from pubsubclub.core.counters import Kind, Source\n"
        "from pubsubclub.core.metrics import Metrics\n"
        "m = Metrics('n')\n"
        "m.count('t', Source.PSC, Kind.RECEIVED)\n"
        "m.count('t', 'psc', 'received')\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent", str(snippet)],
        capture_output=True,
        text=True,
        cwd=PACKAGE.parent,  # this checkout's pubsubclub, as the project's own mypy run sees it
    )
    lines = [line for line in run.stdout.splitlines() if "error:" in line]
    assert [line.split(":")[1] for line in lines] == ["5", "5"], run.stdout  # the two strings on line 5, only


def test_the_node_makes_one_metrics_and_hands_it_down(tmp_path: Path) -> None:
    """Node -> Hub -> Federation share the node's Metrics; a Hub built alone makes its own."""
    node = Node(NodeConfig(), reactor=Clock())
    assert node.hub.metrics is node.metrics and node.federation.metrics is node.metrics
    assert node.metrics.node_id == node.hub.node_id
    mine = Metrics("n1")
    hub = Hub("n1", metrics=mine)
    assert hub.metrics is mine and Federation(hub, reactor=Clock()).metrics is mine
    alone = Hub("n2")
    assert alone.metrics is not mine and alone.metrics.node_id == "n2"
    alone.metrics.count("t", Source.WAMP, Kind.PUBLISHED)
    assert [key for key, _, _ in alone.metrics.totals()] == [("t", "wamp", "published", None, None)]
