"""Shared fixtures: real node processes on 127.0.0.1."""
