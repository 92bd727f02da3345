"""Link authentication, sans-IO: proofs of the cluster secret made and checked without a network."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.federation.auth import (
    DEFAULT_WINDOW,
    MAX_HEADER_LENGTH,
    AuthRefused,
    LinkAuth,
    Proof,
    Refusal,
)

SECRET = b"correct horse battery staple"
OTHER = b"another secret, also 16+ bytes"
HOST = "10.0.0.2:9001"
PATH = "/psc"


class Clock:
    """A settable clock."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Counter:
    """Distinct, predictable nonce bytes."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, size: int) -> bytes:
        self.n += 1
        return self.n.to_bytes(size, "big")


def pair(secret: bytes = SECRET, **kwargs: object) -> tuple[LinkAuth, LinkAuth, Clock]:
    """A dialler's and a listener's LinkAuth on one clock."""
    clock = Clock()
    return (
        LinkAuth(secret, clock=clock, random_bytes=Counter()),
        LinkAuth(SECRET, clock=clock, **kwargs),  # type: ignore[arg-type]
        clock,
    )


def refusal(auth: LinkAuth, header: str | None, node: str = "a", host: str = HOST, path: str = PATH) -> Refusal:
    """The reason ``auth`` refuses ``header``."""
    with pytest.raises(AuthRefused) as e:
        auth.check(header, node, host, path)
    return e.value.refusal


def test_valid_proof_accepted() -> None:
    """A proof made with the same secret for this node, host and path is accepted."""
    dialler, listener, _ = pair()
    proof = dialler.prove("a", HOST, PATH)
    accepted = listener.check(proof.header(), "a", HOST, PATH)
    assert accepted == proof


def test_header_format() -> None:
    """The header is v1:<time>:<32 hex nonce>:<64 hex mac>, and the secret is not in it."""
    dialler, _, clock = pair()
    header = dialler.prove("a", HOST, PATH).header()
    version, timestamp, nonce, mac = header.split(":")
    assert (version, int(timestamp), len(nonce), len(mac)) == ("v1", int(clock.now), 32, 64)
    assert SECRET.hex() not in header and SECRET.decode() not in header


def test_host_case_does_not_matter() -> None:
    """Host names are compared case-insensitively, as HTTP does."""
    dialler, listener, _ = pair()
    proof = dialler.prove("a", "Node-2.example:9001", PATH)
    listener.check(proof.header(), "a", "node-2.EXAMPLE:9001", PATH)


def test_wrong_secret_refused() -> None:
    """A proof made with another secret is refused as a wrong proof."""
    dialler, listener, _ = pair(OTHER)
    assert refusal(listener, dialler.prove("a", HOST, PATH).header()) is Refusal.BAD_MAC


@pytest.mark.parametrize(
    ("node", "host", "path"),
    [("b", HOST, PATH), ("a", "10.0.0.3:9001", PATH), ("a", HOST, "/other"), ("a", "10.0.0.2:9002", PATH)],
)
def test_tampered_fields_refused(node: str, host: str, path: str) -> None:
    """Changing the node id, host or path a proof was made for makes it a wrong proof."""
    dialler, listener, _ = pair()
    header = dialler.prove("a", HOST, PATH).header()
    assert refusal(listener, header, node, host, path) is Refusal.BAD_MAC


def test_tampered_time_refused() -> None:
    """The time is covered by the MAC: moving it makes a wrong proof."""
    dialler, listener, _ = pair()
    version, timestamp, nonce, mac = dialler.prove("a", HOST, PATH).header().split(":")
    assert refusal(listener, f"{version}:{int(timestamp) + 1}:{nonce}:{mac}") is Refusal.BAD_MAC


def test_expired_refused() -> None:
    """A proof older than the window is refused as expired; at the edge it still passes."""
    dialler, listener, clock = pair()
    old = dialler.prove("a", HOST, PATH)
    edge = dialler.prove("a", HOST, PATH)
    clock.now += DEFAULT_WINDOW
    listener.check(edge.header(), "a", HOST, PATH)
    clock.now += 1
    assert refusal(listener, old.header()) is Refusal.EXPIRED


def test_future_refused() -> None:
    """A proof from further ahead than the window is refused as from the future."""
    dialler, listener, clock = pair()
    clock.now += DEFAULT_WINDOW + 1
    proof = dialler.prove("a", HOST, PATH)
    clock.now -= DEFAULT_WINDOW + 1
    assert refusal(listener, proof.header()) is Refusal.FUTURE


def test_window_is_configurable() -> None:
    """A listener with a 5 s window refuses a 6 s old proof."""
    dialler, listener, clock = pair(window=5.0)
    proof = dialler.prove("a", HOST, PATH)
    clock.now += 6
    assert refusal(listener, proof.header()) is Refusal.EXPIRED


def test_replayed_nonce_refused() -> None:
    """The same proof twice within the window: the second is refused as replayed."""
    dialler, listener, _ = pair()
    header = dialler.prove("a", HOST, PATH).header()
    listener.check(header, "a", HOST, PATH)
    assert refusal(listener, header) is Refusal.REPLAYED


def test_each_attempt_gets_a_fresh_nonce() -> None:
    """Two proofs made back to back differ and are both accepted."""
    dialler = LinkAuth(SECRET)
    listener = LinkAuth(SECRET)
    first, second = dialler.prove("a", HOST, PATH), dialler.prove("a", HOST, PATH)
    assert first.nonce != second.nonce
    listener.check(first.header(), "a", HOST, PATH)
    listener.check(second.header(), "a", HOST, PATH)


def test_replay_cache_forgets_expired_nonces() -> None:
    """A full cache drops nonces whose proofs have expired; it never forgets a live one."""
    dialler, listener, clock = pair(max_nonces=2)
    listener.check(dialler.prove("a", HOST, PATH).header(), "a", HOST, PATH)
    listener.check(dialler.prove("a", HOST, PATH).header(), "a", HOST, PATH)
    assert refusal(listener, dialler.prove("a", HOST, PATH).header()) is Refusal.BUSY
    clock.now += DEFAULT_WINDOW + 1
    listener.check(dialler.prove("a", HOST, PATH).header(), "a", HOST, PATH)
    assert listener.remembered() == 1


def test_bad_proofs_are_not_remembered() -> None:
    """Only proofs with a good MAC reach the replay cache, so strangers cannot fill it."""
    dialler, listener, _ = pair(OTHER)
    for _ in range(3):
        refusal(listener, dialler.prove("a", HOST, PATH).header())
    assert listener.remembered() == 0


def test_missing_refused_with_401() -> None:
    """No header at all: MISSING, which is HTTP 401; wrong proofs are 403."""
    _, listener, _ = pair()
    assert refusal(listener, None) is Refusal.MISSING
    assert Refusal.MISSING.http_status == 401
    assert Refusal.BAD_MAC.http_status == Refusal.REPLAYED.http_status == Refusal.EXPIRED.http_status == 403


@pytest.mark.parametrize(
    "header",
    [
        "",
        "v1",
        "v2:1700000000:" + "0" * 32 + ":" + "0" * 64,
        "v1:1700000000:" + "0" * 31 + ":" + "0" * 64,
        "v1:1700000000:" + "0" * 32 + ":" + "0" * 63,
        "v1:-5:" + "0" * 32 + ":" + "0" * 64,
        "v1:1700000000:" + "G" * 32 + ":" + "0" * 64,
        "v1:1700000000:" + "0" * 32 + ":" + "0" * 64 + ":extra",
        "v1:1700000000:" + "0" * 32 + ":" + "0" * 64 + ", v1:1:" + "0" * 32 + ":" + "0" * 64,
        "x" * (MAX_HEADER_LENGTH + 1),
    ],
)
def test_malformed_refused(header: str) -> None:
    """Anything but v1:<digits>:<32 hex>:<64 hex> is refused as malformed."""
    _, listener, _ = pair()
    assert refusal(listener, header) is Refusal.MALFORMED


@given(st.text(max_size=MAX_HEADER_LENGTH + 20))
def test_junk_never_accepted(header: str) -> None:
    """No random header is accepted, and none raises anything but AuthRefused."""
    listener = LinkAuth(SECRET, clock=Clock())
    with pytest.raises(AuthRefused):
        listener.check(header, "a", HOST, PATH)


def test_answer_accepted() -> None:
    """The listener's answer to a proof is accepted by the dialler that made it."""
    dialler, listener, _ = pair()
    proof = dialler.prove("a", HOST, PATH)
    answer = listener.answer("b", listener.check(proof.header(), "a", HOST, PATH))
    dialler.check_answer(answer, "b", proof)


def test_answer_refused() -> None:
    """An answer that is missing, malformed, for another proof or node, or from another secret is refused."""
    dialler, listener, _ = pair()
    proof = dialler.prove("a", HOST, PATH)
    other_proof = dialler.prove("a", HOST, PATH)
    answer = listener.answer("b", proof)
    stranger = LinkAuth(OTHER).answer("b", proof)
    cases = [
        (None, "b", proof, Refusal.MISSING),
        ("v1:nothex", "b", proof, Refusal.MALFORMED),
        (answer, "b", other_proof, Refusal.BAD_MAC),
        (answer, "c", proof, Refusal.BAD_MAC),
        (stranger, "b", proof, Refusal.BAD_MAC),
    ]
    for header, node, for_proof, expected in cases:
        with pytest.raises(AuthRefused) as e:
            dialler.check_answer(header, node, for_proof)
        assert e.value.refusal is expected, (header, node)


def test_answer_is_not_a_request_proof() -> None:
    """The request and answer MACs are domain-separated: neither can stand in for the other."""
    dialler, listener, _ = pair()
    proof = dialler.prove("a", HOST, PATH)
    mac = listener.answer("a", proof).split(":")[1]
    forged = Proof("a", proof.timestamp, proof.nonce, mac)
    assert refusal(listener, forged.header()) is Refusal.BAD_MAC


def test_short_secret_rejected() -> None:
    """Secrets under 16 bytes are refused when the LinkAuth is made."""
    with pytest.raises(ValueError, match="at least 16 bytes"):
        LinkAuth(b"short")


def test_line_break_in_node_id_rejected() -> None:
    """A node id with a line break cannot be proven (it would make the MAC input ambiguous)."""
    dialler, listener, _ = pair()
    with pytest.raises(ValueError):
        dialler.prove("a\nb", HOST, PATH)
    assert refusal(listener, dialler.prove("a", HOST, PATH).header(), node="a\nb") is Refusal.MALFORMED
