"""One sample out of Prometheus text exposition (what a node's ``/metrics`` serves)."""

from __future__ import annotations

import re

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name{...}`` whose labels include ``labels``; 0 when there is none."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        found = dict(_LABEL.findall(label_text))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total
