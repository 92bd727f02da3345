"""The connection layer every listener stands on (docs/architecture.md)."""
