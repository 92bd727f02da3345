"""The report's ``spark-submit`` entry point (docs/report.md).

``spark-submit [--py-files pubsubclub.zip] pubsubclub/reports/submit.py --metrics DIR --out DIR``:
the driver imports the installed (or shipped) ``pubsubclub`` package; this file
parses the same arguments as ``pubsubclub report`` and runs it. The job itself
(:mod:`pubsubclub.reports.job`) is a plain library that imports no command line.
"""

from __future__ import annotations

import argparse
import sys

from pubsubclub.reports.command import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    """Parse ``--metrics ... --out ...`` and run the report; the exit code."""
    parser = argparse.ArgumentParser(prog="pubsubclub-report", description="The pubsubclub cluster report.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
