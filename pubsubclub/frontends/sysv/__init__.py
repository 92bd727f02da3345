"""The System V front-end (docs/sysv.md): C programs on a message queue."""
