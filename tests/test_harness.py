"""The test harness itself: what fails a test besides its own assertions."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.nodes import unhandled_errors


def test_unhandled_error_lines_are_found(tmp_path: Path) -> None:
    """A node log with a traceback or Twisted's 'Unhandled' lines is reported; a clean one is not."""
    clean = tmp_path / "clean.log"
    clean.write_text("2026-11-23 [-] node n1 ready\n2026-11-23 [-] closing PSC link: bad message\n")
    dirty = tmp_path / "dirty.log"
    dirty.write_text("ready\nUnhandled error in Deferred:\nTraceback (most recent call last):\n  File x\nValueError\n")
    assert unhandled_errors(clean) == []
    assert unhandled_errors(dirty) == ["Unhandled error in Deferred:", "Traceback (most recent call last):"]
    assert unhandled_errors(tmp_path / "missing.log") == []


def test_every_test_is_bounded(request: pytest.FixtureRequest) -> None:
    """pytest-timeout is active with a finite bound, so no test can hang the suite."""
    assert request.config.getini("timeout") not in ("", "0", None)
    assert request.config.pluginmanager.hasplugin("timeout")
