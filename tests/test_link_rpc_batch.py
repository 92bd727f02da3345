"""A consumer link decodes each line of a batched frame once, RPC answers included (in memory)."""

from __future__ import annotations

from typing import Any

import pytest

from pubsubclub.federation import psc, psc_rpc, session
from pubsubclub.federation.session import LinkSession, Role

V07 = (psc.V0_1, psc.V0_2, psc.V0_3, psc.V0_4, psc.V0_5, psc.V0_6, psc.V0_7)


class Owner:
    """A LinkOwner that records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("link_"):
            raise AttributeError(name)
        return lambda link, *args: self.calls.append((name, args))


def test_rpc_results_in_a_batch_are_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two PSC404 lines in one 0.7 frame: each reaches the owner once and is decoded once, not twice."""
    owner = Owner()
    link = LinkSession(Role.CONSUMER, [].append, owner, "peer", versions=V07)  # type: ignore[arg-type]
    link.start()
    link.receive(psc.encode(psc.ChooseVersion(psc.V0_7)))
    link.receive(psc.encode(psc.Position("epoch", 0, 0)))  # 0.3 and later: the producer's position first
    decoded: list[bytes] = []
    real = psc.decode

    def counting(data: bytes, *args: Any) -> Any:
        decoded.append(data)
        return real(data, *args)

    monkeypatch.setattr(psc, "decode", counting)
    lines = [psc_rpc.Result(7, ["a"], None, False).encode(), psc_rpc.Result(8, ["b"], None, False).encode()]
    link.receive(psc.BATCH_SEPARATOR.join(lines))
    answers = [args[0] for name, args in owner.calls if name == "link_rpc"]
    assert [(a.call, a.args) for a in answers] == [(7, ["a"]), (8, ["b"])]
    assert decoded == lines and link.last_size == len(lines[1])
    assert session.psc.decode is counting  # the session reads psc.decode at call time (the count is real)
