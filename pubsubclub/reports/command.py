"""The flags of ``pubsubclub report`` and what they run; imports PySpark only when a report runs."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

from pubsubclub.core.dumpfile import DUMP_FORMATS
from pubsubclub.reports.generate import RECORDS_PER_FILE

#: Exit codes of ``pubsubclub report`` (docs/report.md).
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_RECORDS = 3

#: Modules the report needs that a plain ``pip install pubsubclub`` does not bring (the ``[report]`` extra).
REPORT_MODULES = ("pyspark", "matplotlib")
#: The Debian/Ubuntu package with a Java that Spark runs on.
JAVA_PACKAGE = "openjdk-17-jre-headless"


def missing_modules(names: tuple[str, ...] = REPORT_MODULES) -> list[str]:
    """The modules of ``names`` that cannot be imported."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def java_problem(environ: Mapping[str, str]) -> str | None:
    """Why Spark would find no ``java`` in ``environ``, or None; looks where ``spark-class`` does.

    ``JAVA_HOME`` wins when set (its ``bin/java``), else ``java`` on ``PATH``.
    """
    home = environ.get("JAVA_HOME")
    if home:
        if os.access(os.path.join(home, "bin", "java"), os.X_OK):
            return None
        return f"JAVA_HOME={home} holds no bin/java"
    if shutil.which("java", path=environ.get("PATH", os.defpath)) is not None:
        return None
    return "there is no java on PATH and JAVA_HOME is not set"


def _setup_problem(environ: Mapping[str, str]) -> str | None:
    """Why the report cannot start here (missing extra or Java), as one line, or None."""
    missing = missing_modules()
    if missing:
        return f"the report needs {' and '.join(missing)}: pip install 'pubsubclub[report]'"
    if "PYSPARK_GATEWAY_PORT" in environ:  # under spark-submit: the JVM is already running
        return None
    problem = java_problem(environ)
    if problem:
        return f"the report needs Java 17 to run Spark, but {problem} (Debian/Ubuntu: apt-get install {JAVA_PACKAGE})"
    return None


def parse_time(text: str) -> float:
    """Epoch seconds from ``text``: a number of seconds, or ISO-8601 (UTC unless it names an offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not epoch seconds or ISO-8601: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the report flags to ``p``."""
    p.add_argument("--metrics", metavar="DIR", help="folder (or Spark URI) of the nodes' dumps, read recursively")
    p.add_argument("--out", metavar="DIR", required=True, help="folder for the Parquet tables and report.html")
    p.add_argument(
        "--master",
        metavar="URL",
        help="Spark master, e.g. local[2] or spark://host:7077 (default: spark-submit's --master, else local[*])",
    )
    p.add_argument("--since", type=parse_time, metavar="T", help="keep records dumped at or after T (ISO-8601/epoch)")
    p.add_argument("--until", type=parse_time, metavar="T", help="keep records dumped before T (ISO-8601/epoch)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows of the top-topics table (default 10)")
    p.add_argument(
        "--conf",
        type=_conf_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting, e.g. spark.ui.enabled=true (repeatable)",
    )
    gen = p.add_argument_group("synthetic dumps (no Spark)")
    gen.add_argument("--generate", type=int, metavar="N", help="write N synthetic records under --out and exit")
    gen.add_argument("--nodes", type=int, default=3, metavar="K", help="synthetic nodes (default 3)")
    gen.add_argument("--topics", type=int, default=100, metavar="M", help="synthetic topics (default 100)")
    gen.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    gen.add_argument("--workers", type=int, metavar="P", help="generator processes (default: CPU count)")
    gen.add_argument(
        "--dump-format",
        choices=DUMP_FORMATS,
        default="jsonl",
        help="file format, as a node's [metrics] dump-format (default jsonl; parquet needs pyarrow)",
    )
    gen.add_argument(
        "--per-file",
        type=int,
        default=RECORDS_PER_FILE,
        metavar="R",
        help=f"records per dump file (default {RECORDS_PER_FILE})",
    )


def run(args: argparse.Namespace) -> int:
    """Run what the parsed flags ask for: generate dumps or build the report; the exit code."""
    if args.generate is not None:
        from pubsubclub.reports.generate import generate

        try:
            made = generate(
                args.out,
                args.generate,
                args.nodes,
                args.topics,
                args.seed,
                per_file=args.per_file,
                workers=args.workers,
                dump_format=args.dump_format,
            )
        except ValueError as e:
            print(f"pubsubclub report: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        rate = made.records / made.seconds if made.seconds else 0.0
        print(
            f"wrote {made.records:,} records in {made.files:,} files ({args.dump_format}) under {args.out} "
            f"in {made.seconds:.1f} s ({rate:,.0f} records/s)"
        )
        return EXIT_OK
    if not args.metrics:
        print("pubsubclub report: error: --metrics DIR is required (or --generate N)", file=sys.stderr)
        return EXIT_USAGE
    if args.top < 1:
        print("pubsubclub report: error: --top must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    problem = _setup_problem(os.environ)
    if problem:
        print(f"pubsubclub report: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    from pubsubclub.reports.job import InputError, NoRecordsError, print_summary, run_report

    try:
        result = run_report(
            args.metrics,
            args.out,
            master=args.master,
            since=args.since,
            until=args.until,
            top=args.top,
            conf=dict(args.conf),
        )
    except InputError as e:
        print(f"pubsubclub report: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except NoRecordsError as e:
        print(f"pubsubclub report: {e}", file=sys.stderr)
        return EXIT_NO_RECORDS
    print_summary(result)
    return EXIT_OK
