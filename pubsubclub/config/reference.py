"""The settings table of docs/configuration.md, generated from the declarations (a test keeps them equal)."""

from __future__ import annotations

from pubsubclub.config.model import declared


def reference_markdown() -> str:
    """The table of every setting (docs/configuration.md holds it verbatim; a test keeps them equal)."""
    rows = ["| TOML | flag | default | what |", "|---|---|---|---|"]
    for s in declared():
        meta = s.field.metadata
        shown = meta.get("shown_default")
        if s.kind == "bool":
            shown = "true" if s.default else "false"
        elif shown is None:
            shown = "none" if s.default in ((), None) else repr(s.default).replace("'", '"')
        text = str(meta["help"]).replace("|", "\\|")
        rows.append(f"| `{s.toml_name()}` | `{s.flag}` | {shown} | {text} |")
    return "\n".join(rows) + "\n"
