"""The cluster report: a PySpark job over the nodes' metrics dumps (docs/report.md).

``transforms`` holds the pure DataFrame -> DataFrame steps, ``job`` the edge
(reading dumps, writing Parquet and ``report.html``), ``generate`` the
synthetic dump writer, ``command`` the ``pubsubclub report`` flags. Importing
this package does not import PySpark.
"""
