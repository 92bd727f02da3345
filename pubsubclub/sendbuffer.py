"""Moved to :mod:`pubsubclub.net.sendbuffer` (the connection layer); kept importable here."""

from pubsubclub.net.sendbuffer import SendBacklog, watch_send_buffer, write_buffer_of

__all__ = ["SendBacklog", "watch_send_buffer", "write_buffer_of"]
