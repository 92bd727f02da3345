"""The pubsubclub flags and command lines of README.md and docs/*.md are ones the CLI accepts.

The parser is the CLI's own (``pubsubclub.cli.command.parser``); nothing is run, only parsed.
docs/specs/ is left out: it is the protocols' text, not the command's.

**Command lines** (fenced blocks). Only blocks with no info string or ``sh``, ``bash``, ``shell``,
``console`` are read (``python``, ``toml``, ``json``, ``text``, ``c`` blocks are code, settings or
output). A line ending in ``\\`` runs on into the next. In a block that has ``$`` prompts only the
prompted lines are commands and every other line is output; in a block without prompts every line is
a candidate. A candidate is split as the shell would (``shlex``, ``#`` comments dropped; a
``<placeholder>`` with spaces in it is one word) and cut at ``&&``, ``||``, ``;``, ``|`` and ``&``.
In each piece, leading ``NAME=value`` settings, a ``time`` or ``/usr/bin/time`` wrapper (with ``-f
FORMAT``, ``-v``, ``-p``) and output redirections (``> FILE``) are dropped; the piece is a pubsubclub
command when what is left starts with ``pubsubclub`` (or a path ending in it, e.g.
``.venv/bin/pubsubclub``) or ``python``/``python3`` (any path) ``-m pubsubclub``, and the word after
that does not end in ``:`` (``pubsubclub report: error: ...`` is the command's output). Every other
piece is another tool's (pytest, make, crossbar, docker, curl, ...), even when it carries a
pubsubclub flag (``make bench-peers BENCH_PEERS_ARGS='--runs 3'``), and so is a comment line
(``# = pubsubclub bench ...``).

Each command must name a subcommand, every ``--flag`` in it must be one of that subcommand's own,
spelled in full (``parse_args`` would take an abbreviation too), and ``parse_args`` must take the
whole line without exiting. Placeholders: a ``...`` word (the rest elided) is dropped; ``<name>``
and ``$VAR`` words are kept as string values (no doc puts one where a number goes, and the parse
would say so). A *synopsis* (a word in ``[brackets]``, e.g. ``[--runs N]``) shows metavars, not
values: its flags are checked, it is not parsed.

**Prose flags** (code spans outside fenced blocks; a span may wrap a line):

- a span that is a pubsubclub command by the rule above (``pubsubclub bench --client lean``), or that
  starts with a subcommand's name and a long flag (``bench --scenario idle``, short for ``pubsubclub
  bench --scenario idle``): the subcommand must exist and each ``--flag`` must be its own; the span
  is not parsed (prose shows fragments and metavars);
- a span that starts with ``--`` (``--workers N``, ``--max-message-size + --link-headroom``): each
  ``--flag`` in it must belong to at least one subcommand; ``--tep...`` and ``--reconnect-*`` name a
  family, which must have a member;
- any other span is another tool's (``pytest -q -n 2 --dist loadfile``, ``valgrind
  --tool=callgrind``, ``subscribe --from earliest``) and is not collected.

Flags outside code spans (plain prose, the generated table's help texts) are not collected. A span
starting with ``--`` that holds another tool's flag, or one the CLI refuses on purpose, is listed in
:data:`NOT_OURS` with the doc it stands in and why; an entry no doc needs any longer fails a test.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pubsubclub.cli.command import parser

REPO = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]

#: Fenced blocks read for command lines, by info string.
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}

#: Prose spans starting with ``--`` that name another tool's flag (or one the CLI refuses on purpose):
#: doc -> flag -> why it is not the CLI's.
NOT_OURS = {
    "README.md": {
        "--peers": "the misspelt flag the CLI's did-you-mean hint is shown for",
        "--from": "examples/stream/client.py's subscribe flag",
        "--commit": "the same client's",
    },
    "docs/architecture.md": {
        "--state-file": "the Consul double's (python -m pubsubclub.testing.consul_agent)",
        "--driver-java-options": "spark-submit's",
        "--durations": "pytest's",
        "--dist": "pytest-xdist's",
    },
    "docs/benchmarks.md": {"--loglevel": "Crossbar.io's (crossbar start --loglevel): the routers of make bench-peers"},
    "docs/conformance.md": {"--experimental-websocket": "Node.js 20's"},
    "docs/report.md": {"--py-files": "spark-submit's", "--deploy-mode": "spark-submit's"},
    "docs/security.md": {"--host": "examples/tls/make_certs.py's"},
}

_FENCE = re.compile(r"^\s*```\s*(\S*)")
_SPAN = re.compile(r"(`+)((?:(?!\n\s*\n)[^`])+?)\1")
_FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)(\*|\.\.\.)?")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_REDIRECT = re.compile(r"\d*>>?(&\d+)?|&>")
_PLACEHOLDER = re.compile(r"<[^<>\s][^<>\n]*>")
_OPERATORS = {"&&", "||", ";", "|", "&"}
_TIME_OPTIONS = {"-v": 0, "-p": 0, "-f": 1}


@dataclass(frozen=True)
class Flag:
    """A long flag a doc names, and the subcommand it is given to (None: any)."""

    doc: str
    line: int
    flag: str
    command: str | None
    family: bool = False

    def shown(self) -> str:
        """The flag as the doc shows it."""
        return f"{self.flag}..." if self.family else self.flag


@dataclass(frozen=True)
class CommandLine:
    """A pubsubclub command line of a fenced block: the words after ``pubsubclub``, as written."""

    doc: str
    line: int
    words: tuple[str, ...]
    text: str

    @property
    def synopsis(self) -> bool:
        """The line shows ``[optional]`` parts with metavars: flags are checked, it is not parsed."""
        return any(w.startswith("[") for w in self.words)


@functools.cache
def cli() -> argparse.ArgumentParser:
    """The CLI's parser, built once."""
    return parser()


@functools.cache
def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Subcommand name -> its parser."""
    [commands] = [a for a in cli()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def flags_of(command: str) -> frozenset[str]:
    """Every option string ``pubsubclub COMMAND`` takes."""
    return frozenset(o for a in subcommands()[command]._actions for o in a.option_strings)


def every_flag() -> frozenset[str]:
    """Every option string of any subcommand."""
    return frozenset().union(*(flags_of(c) for c in subcommands()))


def parse_error(words: tuple[str, ...]) -> str | None:
    """What argparse says when it refuses ``pubsubclub WORDS`` (it would exit), or None."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            cli().parse_args(list(words))
    except SystemExit as e:
        lines = said.getvalue().strip().splitlines()
        return lines[-1] if lines else f"parse_args exits with status {e.code}"
    return None


def split_blocks(text: str) -> tuple[list[tuple[str, list[tuple[int, str]]]], str]:
    """The fenced blocks of ``text`` (info string, numbered lines), and the text with them blanked."""
    blocks: list[tuple[str, list[tuple[int, str]]]] = []
    prose: list[str] = []
    current: list[tuple[int, str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if current is None and fence:
            current = []
            blocks.append((fence.group(1), current))
        elif current is not None and fence:
            current = None
        elif current is not None:
            current.append((number, line))
        prose.append(line if current is None and not fence else "")
    return blocks, "\n".join(prose)


def candidate_lines(block: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """The block's lines that may be commands (continuations joined), each with its first line's number."""
    prompted = any(line.lstrip().startswith("$ ") for _, line in block)
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in block:
        start, text = pending if pending else (number, "")
        text += line.rstrip()
        if text.endswith("\\"):
            pending = (start, text[:-1] + " ")
            continue
        pending = None
        joined.append((start, text))
    for number, text in joined:
        stripped = text.lstrip()
        if prompted and not stripped.startswith("$ "):
            continue  # output
        yield number, stripped[2:] if prompted else stripped


def pubsubclub_words(text: str) -> list[tuple[str, ...]]:
    """For each pubsubclub command in a shell line, the words after ``pubsubclub`` (see the module doc)."""
    text = _PLACEHOLDER.sub(lambda m: m.group(0).replace(" ", "_"), text)
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return []  # unbalanced quotes: prose-like text, not a command
    pieces: list[list[str]] = [[]]
    for word in words:
        if word in _OPERATORS:
            pieces.append([])
        else:
            pieces[-1].append(word)
    found = []
    for piece in pieces:
        rest = command_of(piece)
        if rest is not None and not (rest and rest[0].endswith(":")):
            found.append(tuple(rest))
    return found


def command_of(piece: list[str]) -> list[str] | None:
    """The words after ``pubsubclub`` if ``piece`` runs it, else None."""
    i = 0
    while i < len(piece) and _ENV.match(piece[i]):
        i += 1
    if i < len(piece) and piece[i].rsplit("/", 1)[-1] == "time":
        i += 1
        while i < len(piece) and piece[i] in _TIME_OPTIONS:
            i += 1 + _TIME_OPTIONS[piece[i]]
    head = piece[i : i + 3]
    if head[:1] and (head[0] == "pubsubclub" or head[0].endswith("/pubsubclub")):
        rest = piece[i + 1 :]
    elif len(head) == 3 and re.fullmatch(r"(\S*/)?python3?", head[0]) and head[1:] == ["-m", "pubsubclub"]:
        rest = piece[i + 3 :]
    else:
        return None
    kept: list[str] = []
    skip = False
    for word in rest:
        if skip:
            skip = False
        elif _REDIRECT.fullmatch(word):
            skip = not word.endswith(("&1", "&2"))
        elif not re.match(r"\d*>", word) and word != "...":
            kept.append(word)
    return kept


def commands_in(doc: str, text: str) -> list[CommandLine]:
    """The pubsubclub command lines of the shell blocks of ``text`` (the doc named ``doc``)."""
    blocks, _ = split_blocks(text)
    found: list[CommandLine] = []
    for info, block in blocks:
        if info not in SHELL_BLOCKS:
            continue
        for number, line in candidate_lines(block):
            found += [CommandLine(doc, number, words, " ".join(line.split())) for words in pubsubclub_words(line)]
    return found


def command_flags(doc: str, line: int, words: tuple[str, ...]) -> list[Flag]:
    """The long flags of ``pubsubclub WORDS`` (``[--opt`` and ``--opt=value`` too), each for its subcommand.

    A subcommand that does not exist is given back as the one item, a Flag whose flag is its name.
    """
    if not words:
        return []
    if words[0] not in subcommands():
        return [Flag(doc, line, words[0], words[0])]
    found = []
    for word in words[1:]:
        match = _FLAG.match(word.lstrip("["))
        if match:
            found.append(Flag(doc, line, match.group(1), words[0], family=match.group(2) is not None))
    return found


def flags_named(doc: str, text: str) -> list[Flag]:
    """Every pubsubclub flag ``text`` (the doc named ``doc``) names: in its command lines and its code spans."""
    found: list[Flag] = []
    for command in commands_in(doc, text):
        found += command_flags(doc, command.line, command.words)
    _, prose = split_blocks(text)
    for span in _SPAN.finditer(prose):
        line = prose.count("\n", 0, span.start()) + 1
        text = " ".join(span.group(2).split())
        if text.startswith("--"):
            found += [Flag(doc, line, m.group(1), None, m.group(2) is not None) for m in _FLAG.finditer(text)]
            continue
        first = text.split(" ", 1)[0]
        if first in subcommands() and re.match(r"\S+ --", text):
            text = f"pubsubclub {text}"
        for words in pubsubclub_words(text):
            found += command_flags(doc, line, words)
    return found


def problem(flag: Flag) -> str | None:
    """Why ``flag`` is not one the CLI takes where the doc gives it, or None."""
    if flag.command is not None and flag.command not in subcommands():
        return f"pubsubclub has no command {flag.command!r} (it has {', '.join(subcommands())})"
    known = flags_of(flag.command) if flag.command else every_flag()
    if flag.family:
        ok = any(f.startswith(flag.flag) for f in known)
    else:
        ok = flag.flag in known
    if ok:
        return None
    where = f"pubsubclub {flag.command}" if flag.command else "any pubsubclub command"
    return f"{flag.shown()} is not a flag of {where}"


def flag_problems(doc: str, text: str) -> list[str]:
    """``doc:line: why`` for each flag of ``text`` the CLI does not take where the doc gives it."""
    wrong = []
    for flag in flags_named(doc, text):
        why = problem(flag)
        if why and (flag.command is not None or flag.flag not in NOT_OURS.get(flag.doc, {})):
            wrong.append(f"{flag.doc}:{flag.line}: {why}")
    return wrong


def command_problems(doc: str, text: str) -> list[str]:
    """``doc:line: `command`: argparse's error`` for each full command line of ``text`` parse_args refuses."""
    wrong = []
    for command in commands_in(doc, text):
        said = None if command.synopsis else parse_error(command.words)
        if said:
            wrong.append(f"{command.doc}:{command.line}: `{command.text}`: {said}")
    return wrong


@functools.cache
def read(doc: str) -> str:
    """The text of ``doc`` (a path relative to the repository)."""
    return (REPO / doc).read_text()


@functools.cache
def doc_flags(doc: str) -> tuple[Flag, ...]:
    """The flags ``doc`` names."""
    return tuple(flags_named(doc, read(doc)))


@pytest.mark.parametrize("doc", DOCS)
def test_every_flag_a_doc_names_is_the_clis(doc: str) -> None:
    """Each pubsubclub flag in ``doc``'s commands and code spans is taken by its subcommand (or by one)."""
    wrong = flag_problems(doc, read(doc))
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_line_a_doc_shows_parses(doc: str) -> None:
    """Each full pubsubclub command line in ``doc``'s shell blocks is taken by ``parse_args``."""
    wrong = command_problems(doc, read(doc))
    assert not wrong, "\n".join(wrong)


def test_not_ours_entries_are_still_needed() -> None:
    """Every :data:`NOT_OURS` entry is a flag its doc still names and the CLI does not take."""
    named = {(f.doc, f.flag) for doc in DOCS for f in doc_flags(doc) if f.command is None}
    listed = [(doc, flag) for doc, flags in NOT_OURS.items() for flag in flags]
    stale = [f"{doc}: {flag}" for doc, flag in listed if (doc, flag) not in named or flag in every_flag()]
    assert not stale, "NOT_OURS entries no doc needs: " + ", ".join(stale)


def test_the_rule_keeps_pubsubclub_commands_and_leaves_other_tools() -> None:
    """Commands in wrappers, prompts and continuations are found; other tools' lines, output and comments are not."""
    block = [
        (1, "$ PYTHONPATH=<tree> /usr/bin/time -f 'wall %e s' .venv/bin/python -m pubsubclub bench \\"),
        (2, "    --json > tail.json   # the bar"),
        (3, "pubsubclub node --workers 2"),
        (4, "$ pytest -q -n 2 --dist loadfile && cd x && pubsubclub status --http http://127.0.0.1:8181/ &"),
        (5, "$ # = pubsubclub bench --scenario peers"),
        (6, "$ make bench-peers BENCH_PEERS_ARGS='--runs 3'"),
    ]
    found = [(n, words) for n, text in candidate_lines(block) for words in pubsubclub_words(text)]
    assert found == [(1, ("bench", "--json")), (4, ("status", "--http", "http://127.0.0.1:8181/"))]


WRONG_DOC = """\
Flags `--stream-max-topic`, `--no-learn-peers`, `--reconnect-*`, `--nsd...` and `--peers`;
`pubsubclub status --workers 2`, `bench --scenario idle` and
`pubsubclub nodes --name n1`.

```sh
$ pubsubclub bench --scenario tails \\
    --json
usage: pubsubclub bench [-h] ...
$ .venv/bin/pubsubclub node --max-send 5 --name n1   # an abbreviation parse_args would take
$ pubsubclub bench --scenario tail [--runs N]
```
"""


def test_a_wrong_flag_or_command_is_reported_with_its_place() -> None:
    """A misspelt or abbreviated flag, another command's flag, a command that is not one: each named at doc:line."""
    assert flag_problems("docs/x.md", WRONG_DOC) == [
        "docs/x.md:9: --max-send is not a flag of pubsubclub node",
        "docs/x.md:1: --stream-max-topic is not a flag of any pubsubclub command",
        "docs/x.md:1: --peers is not a flag of any pubsubclub command",  # NOT_OURS is README.md's
        "docs/x.md:2: --workers is not a flag of pubsubclub status",
        "docs/x.md:3: pubsubclub has no command 'nodes' (it has node, bridge, cluster, status, bench, report)",
    ]
    (problem,) = command_problems("docs/x.md", WRONG_DOC)  # argparse then lists the scenarios there are
    assert problem.startswith(
        "docs/x.md:6: `pubsubclub bench --scenario tails --json`: pubsubclub bench: error: argument --scenario:"
        " invalid choice: 'tails' (choose from 'wamp', "
    )
    assert flag_problems("README.md", "`--peers`") == []


def test_the_docs_name_enough_flags_and_commands_to_check() -> None:
    """The collector finds what the docs are known to hold, so an empty harvest cannot pass."""
    flags = {f.flag for doc in DOCS for f in doc_flags(doc)}
    assert {"--workers", "--stream-max-topics", "--no-learn-peers", "--wamp-base-port", "--bar-ms"} <= flags
    assert sum(len(commands_in(doc, read(doc))) for doc in DOCS) > 50
