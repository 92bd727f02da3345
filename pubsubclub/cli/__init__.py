"""The ``pubsubclub`` command line: ``main`` (command.py) and ``pubsubclub cluster`` (cluster.py)."""

from pubsubclub.cli.command import main

__all__ = ["main"]
