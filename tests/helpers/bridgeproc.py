"""``pubsubclub bridge`` processes for the tests, next to real Crossbar.io routers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from helpers.nodes import NodeProcess, reconnect_flags
from helpers.polling import until, wait_until
from pubsubclub.testing.crossbar import CrossbarProcess


class BridgeProcess(NodeProcess):
    """One ``python -m pubsubclub bridge`` process joined to ``router`` as ``authid`` (ticket auth by default)."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        router: CrossbarProcess,
        authid: str = "bridge-1",
        method: str = "ticket",
        extra: tuple[str, ...] = (),
    ) -> None:
        super().__init__(name, log_dir, extra=extra)
        self.router = router
        self.authid = authid
        self.method = method

    def command(self) -> list[str]:
        """The bridge's command line: credentials from a file, never on the command line."""
        secret_path = self.log_path.with_suffix(f".{self.method}")
        if self.method == "ticket":
            secret_path.write_text(f"ticket-of-{self.authid}\n")
            credentials = ["--authid", self.authid, "--ticket-file", str(secret_path)]
        else:
            secret_path.write_text(f"secret-of-{self.authid}\n")
            credentials = ["--authid", self.authid, "--cra-secret-file", str(secret_path)]
        cmd = [
            sys.executable,
            "-m",
            "pubsubclub",
            "bridge",
            "--name",
            self.name,
            "--router",
            self.router.url,
            "--realm",
            "realm1",
            *credentials,
            "--psc",
            f"tcp:{self.psc_port}:interface=127.0.0.1",
            "--http",
            "tcp:0:interface=127.0.0.1",
            "--log-level",
            "info",
            *self.extra,
        ]
        cmd += reconnect_flags(self.reconnect_initial, self.extra)
        for peer in self.peers:
            cmd += ["--peer", peer]
        return cmd

    def _read_back_ports(self) -> None:
        self.http_port = int(self.ready["ops"].rsplit(":", 1)[1].split("/", 1)[0])

    def bridge_stats(self) -> dict[str, Any]:
        """The ``bridge`` part of /stats."""
        return dict(self.stats()["bridge"])

    def active(self) -> bool:
        """Whether this bridge holds its router's lock (it carries messages)."""
        return bool(self.bridge_stats()["active"])

    def carries(self, interest: tuple[str, ...] = (), router_subscriptions: tuple[str, ...] = ()) -> bool:
        """Active, wanting ``interest`` for its router's clients, subscribed there to ``router_subscriptions``."""
        stats = self.bridge_stats()
        return (
            stats["active"]
            and set(interest) <= set(stats["interest"])
            and set(router_subscriptions) <= set(stats["router_subscriptions"])
        )

    async def until_carries(self, interest: tuple[str, ...] = (), router_subscriptions: tuple[str, ...] = ()) -> None:
        """Poll (on the reactor) until :meth:`carries`."""
        await until(
            lambda: self.carries(interest, router_subscriptions),
            f"{self.name} active with interest {interest} and router subscriptions {router_subscriptions}",
        )

    def wait_carries(self, interest: tuple[str, ...] = (), router_subscriptions: tuple[str, ...] = ()) -> None:
        """Block until :meth:`carries`."""
        wait_until(
            lambda: self.carries(interest, router_subscriptions),
            f"{self.name} active with interest {interest} and router subscriptions {router_subscriptions}",
        )
