"""The TEP front-end (docs/tep.md): Transport Exchange Protocol clients over WebSocket."""
