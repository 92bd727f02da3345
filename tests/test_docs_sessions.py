"""The "Try it" sessions of docs/nsd.md and docs/tep.md, run against real nodes.

Each doc's "Try it" section holds one ``sh`` block (how to start the node),
one ``python`` block (the client snippet, which reads the node's address from
environment variables with documented defaults) and one ``text`` block (what
the snippet prints). The test runs the snippet as a subprocess against a node
started with ``NodeProcess(..., frontends=True)`` and compares its output,
after :func:`normalise`, with the ``text`` block, so the docs cannot rot.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.nodes import OPS_TOKEN, REPO, NodeProcess

pytestmark = pytest.mark.slow

#: Bound for one snippet run (it makes a handful of local requests).
SNIPPET_SECONDS = 60

#: Placeholder the NSD doc shows for a ``when`` timestamp (and an ``after`` cursor taken from one).
WHEN_PLACEHOLDER = "<when>"
_WHEN = re.compile(r'("when"|"after"):[1-9][0-9]*')

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class TrySection:
    """The blocks of one doc's "Try it" section."""

    shell: str
    snippet: str
    expected: str


def try_section(doc: Path) -> TrySection:
    """The ``sh``, ``python`` and ``text`` blocks of ``doc``'s "Try it" section (exactly one each)."""
    text = doc.read_text()
    parts = re.split(r"^## Try it\n", text, flags=re.MULTILINE)
    assert len(parts) == 2, f"{doc.name}: expected exactly one '## Try it' heading"
    section = re.split(r"^## ", parts[1], maxsplit=1, flags=re.MULTILINE)[0]
    blocks: dict[str, list[str]] = {}
    for language, body in _FENCE.findall(section):
        blocks.setdefault(language, []).append(body)
    for language in ("sh", "python", "text"):
        count = len(blocks.get(language, []))
        assert count == 1, f"{doc.name}: 'Try it' has {count} ```{language} blocks, expected 1"
    return TrySection(blocks["sh"][0], blocks["python"][0], blocks["text"][0])


def env_defaults(snippet: str) -> dict[str, str]:
    """``os.environ.get(NAME, DEFAULT)`` calls of ``snippet``: NAME -> DEFAULT."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(snippet)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and ast.unparse(node.func.value) == "os.environ"
            and len(node.args) == 2
        ):
            name, default = (ast.literal_eval(arg) for arg in node.args)
            found[name] = default
    return found


def normalise(output: str) -> str:
    """``output`` with every ``when``/``after`` timestamp replaced by the doc's placeholder."""
    return _WHEN.sub(lambda m: f"{m.group(1)}:{WHEN_PLACEHOLDER}", output)


def assert_session(doc: str, printed: str, expected: str) -> None:
    """Fail with a line diff unless the snippet of ``doc`` printed ``expected``."""
    if printed != expected:
        diff = difflib.unified_diff(expected.splitlines(), printed.splitlines(), "documented", "printed", lineterm="")
        pytest.fail(f"{doc}: the 'Try it' output is out of date:\n" + "\n".join(diff), pytrace=False)


def run_snippet(snippet: str, env: dict[str, str], cwd: Path) -> str:
    """Run ``snippet`` with the tests' Python and ``env`` added; its stdout (it must exit 0)."""
    path = cwd / "snippet.py"
    path.write_text(snippet)
    full_env = {**os.environ, **env, "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"}
    try:
        done = subprocess.run(
            [sys.executable, str(path)],
            env=full_env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=SNIPPET_SECONDS,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the snippet did not finish within {SNIPPET_SECONDS} s; stdout:\n{e.stdout}") from None
    assert done.returncode == 0, f"the snippet failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_nsd_try_it_session(tmp_path: Path) -> None:
    """The NSD snippet of docs/nsd.md prints exactly the documented session against a fresh node."""
    doc = try_section(REPO / "docs" / "nsd.md")
    defaults = env_defaults(doc.snippet)
    assert set(defaults) == {"NSD_ADDR"}, defaults
    port = defaults["NSD_ADDR"].rsplit(":", 1)[1]
    assert f"--nsd tcp:{port}:interface=127.0.0.1" in doc.shell, "the command line and the snippet disagree"
    node = NodeProcess("docs-nsd", tmp_path, frontends=True).start()
    try:
        output = run_snippet(doc.snippet, {"NSD_ADDR": f"127.0.0.1:{node.nsd_port}"}, tmp_path)
    finally:
        node.stop()
    assert_session("docs/nsd.md", normalise(output), doc.expected)


def test_tep_try_it_session(tmp_path: Path) -> None:
    """The TEP snippet of docs/tep.md prints exactly the documented session against a node."""
    doc = try_section(REPO / "docs" / "tep.md")
    defaults = env_defaults(doc.snippet)
    assert set(defaults) == {"TEP_URL", "TEP_OPS_URL", "TEP_OPS_TOKEN"}, defaults
    tep_port = defaults["TEP_URL"].split(":")[2].split("/")[0]
    ops_port = defaults["TEP_OPS_URL"].rsplit(":", 1)[1]
    assert f"--tep tcp:{tep_port}:interface=127.0.0.1" in doc.shell, "the command line and the snippet disagree"
    assert f"--http tcp:{ops_port}:interface=127.0.0.1" in doc.shell, "the command line and the snippet disagree"
    assert defaults["TEP_OPS_TOKEN"] in doc.shell, "the token file written and the snippet's token disagree"
    node = NodeProcess("docs-tep", tmp_path, frontends=True).start()
    try:
        env = {
            "TEP_URL": node.tep_url,
            "TEP_OPS_URL": f"http://127.0.0.1:{node.http_port}",
            "TEP_OPS_TOKEN": OPS_TOKEN,
        }
        output = run_snippet(doc.snippet, env, tmp_path)
    finally:
        node.stop()
    assert_session("docs/tep.md", output, doc.expected)
