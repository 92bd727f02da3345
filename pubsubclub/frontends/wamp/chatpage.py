"""Where the browser chat page and its autobahn-js bundle are found."""

from __future__ import annotations

import os
from pathlib import Path

#: The chat page's files (index.html, chat.js), served at ``/`` of the WAMP listener.
STATIC_DIR = Path(__file__).parents[2] / "static"


def find_autobahn_js() -> Path | None:
    """The autobahn-js browser bundle for the chat page, if installed."""
    candidates = []
    if os.environ.get("PUBSUBCLUB_AUTOBAHN_JS"):
        candidates.append(Path(os.environ["PUBSUBCLUB_AUTOBAHN_JS"]))
    candidates.append(STATIC_DIR / "vendor" / "autobahn.min.js")
    repo_js = Path(__file__).resolve().parents[3] / "js" / "node_modules"
    candidates.append(repo_js / "autobahn-browser" / "autobahn.min.js")
    for path in candidates:
        if path.is_file():
            return path
    return None
