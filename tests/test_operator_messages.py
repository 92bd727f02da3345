"""Operator-facing messages: warnings and errors that say what to do (issue 21)."""

from __future__ import annotations

from pathlib import Path

from conftest import NodeProcess


def test_world_readable_cluster_secret_gets_a_security_warning(tmp_path: Path) -> None:
    """A cluster secret every user may read logs a SECURITY WARNING naming it and chmod 600; a 0600 one does not."""
    secret = tmp_path / "cluster-secret"
    secret.write_text("0123456789abcdef" * 4 + "\n")
    logs = {}
    for mode in (0o644, 0o600):
        secret.chmod(mode)
        node = NodeProcess(f"mode{mode:o}", tmp_path, extra=("--cluster-secret-file", str(secret)))
        node.start()
        node.stop()
        logs[mode] = [line for line in node.log_path.read_text().splitlines() if "SECURITY WARNING" in line]
    assert len(logs[0o644]) == 1, logs[0o644]
    assert str(secret) in logs[0o644][0] and "chmod 600" in logs[0o644][0]
    assert logs[0o600] == []
