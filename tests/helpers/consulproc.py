"""The Consul double as a separate process (``python -m pubsubclub.testing.consul_agent``), for node-process tests."""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from helpers.nodes import REPO
from helpers.polling import WAIT_SECONDS
from helpers.ports import free_port


class ConsulDoubleProcess:
    """One double process on a fixed port; it can be restarted on the same port."""

    def __init__(self, log_dir: Path, state_file: Path | None = None) -> None:
        self.port = free_port()
        self.state_file = state_file
        self.log_path = log_dir / "consul-double.log"
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        """The agent URL nodes get with ``--consul``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ConsulDoubleProcess:
        """Start and wait for the ready line."""
        cmd = [sys.executable, "-m", "pubsubclub.testing.consul_agent", "--port", str(self.port)]
        if self.state_file is not None:
            cmd += ["--state-file", str(self.state_file)]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO)
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(WAIT_SECONDS):
            raise AssertionError(f"consul double did not get ready; log:\n{self.log_path.read_text()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"consul double exited; log:\n{self.log_path.read_text()}")
        assert json.loads(line) == {"event": "ready", "consul": self.url}
        return self

    def stop(self) -> None:
        """SIGTERM and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(WAIT_SECONDS)

    def get(self, path: str) -> Any:
        """GET a JSON answer (None on 404)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def passing(self, service: str = "pubsubclub") -> list[str]:
        """Ids of the service's passing instances."""
        return sorted(e["Service"]["ID"] for e in self.get(f"/v1/health/service/{service}?passing"))

    def registered(self) -> list[str]:
        """Ids of the services registered with the agent."""
        return sorted(self.get("/v1/agent/services"))
