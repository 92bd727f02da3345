"""The NSD front-end (docs/nsd.md): TCP lines, the codec and the SQLite store."""
