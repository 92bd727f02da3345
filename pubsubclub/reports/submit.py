"""The report's ``spark-submit`` entry point (docs/report.md).

``spark-submit [--py-files pubsubclub.zip] pubsubclub/reports/submit.py --metrics DIR --out DIR``:
the driver imports the installed (or shipped) ``pubsubclub`` package; this file
only hands the command line to :func:`pubsubclub.reports.job.main`.
"""

import sys

from pubsubclub.reports.job import main

if __name__ == "__main__":
    sys.exit(main())
