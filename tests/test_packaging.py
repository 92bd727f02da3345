"""What a plain ``pip install pubsubclub`` gets: the chat page's bundle as package data, the report as an extra."""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pubsubclub.frontends.wamp.chatpage import STATIC_DIR, find_autobahn_js

REPO = Path(__file__).resolve().parent.parent


def test_vendored_bundle_is_found_first_and_carries_its_licence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an override the chat page uses the vendored bundle; its MIT licence sits beside it."""
    monkeypatch.delenv("PUBSUBCLUB_AUTOBAHN_JS", raising=False)
    bundle = find_autobahn_js()
    assert bundle == STATIC_DIR / "vendor" / "autobahn.min.js"
    assert bundle.stat().st_size > 100_000
    assert "Permission is hereby granted" in (STATIC_DIR / "vendor" / "autobahn.LICENSE").read_text()


def test_report_dependencies_are_an_extra() -> None:
    """pyspark and matplotlib are in the [report] extra, pyarrow in [parquet], none in what a node install pulls in."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    required = cfg["options"]["install_requires"]
    extras = cfg["options.extras_require"]
    assert "pyspark" not in required and "matplotlib" not in required and "pyarrow" not in required
    assert "pyspark" in extras["report"] and "matplotlib" in extras["report"]
    assert "pyarrow" in extras["parquet"]


@pytest.mark.slow
def test_wheel_ships_the_chat_page_and_its_bundle(tmp_path: Path) -> None:
    """A wheel built from the tree holds index.html, chat.js, the bundle and its licence."""
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"]
    subprocess.run([*command, "-w", str(tmp_path), str(REPO)], check=True, timeout=300)
    [wheel] = tmp_path.glob("pubsubclub-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("index.html", "chat.js", "vendor/autobahn.min.js", "vendor/autobahn.LICENSE"):
        assert f"pubsubclub/static/{name}" in names, name
