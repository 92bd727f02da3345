"""Link authentication, sans-IO: the challenge-response of the cluster secret, without a network."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.federation.auth import (
    MAX_HEADER_LENGTH,
    PROOF_PREFIX,
    AuthRefused,
    Challenge,
    LinkAuth,
    Refusal,
)

SECRET = b"correct horse battery staple"
OTHER = b"another secret, also 16+ bytes"


class Counter:
    """Distinct, predictable nonce bytes."""

    def __init__(self, start: int = 0) -> None:
        self.n = start

    def __call__(self, size: int) -> bytes:
        self.n += 1
        return self.n.to_bytes(size, "big")


def pair(dialler_secret: bytes = SECRET, **kwargs: int) -> tuple[LinkAuth, LinkAuth]:
    """A dialler's and a listener's LinkAuth; their nonces never collide."""
    return LinkAuth(dialler_secret, random_bytes=Counter()), LinkAuth(SECRET, random_bytes=Counter(1 << 64), **kwargs)


def exchange(dialler: LinkAuth, listener: LinkAuth, a: str = "a", b: str = "b") -> tuple[Challenge, bytes]:
    """One full exchange from node ``a`` to node ``b``: the listener's challenge and the dialler's proof frame."""
    offer = dialler.offer(a)
    challenge = listener.challenge(offer.header(), a, b)
    return challenge, dialler.prove(offer, challenge.header(), b)


def refused(call: object, *args: object) -> Refusal:
    """The refusal ``call(*args)`` raises."""
    with pytest.raises(AuthRefused) as e:
        call(*args)  # type: ignore[operator]
    return e.value.refusal


def test_valid_exchange_accepted() -> None:
    """Offer, answer, proof with one secret: the listener accepts and holds nothing afterwards."""
    dialler, listener = pair()
    challenge, frame = exchange(dialler, listener)
    assert listener.pending() == 1
    listener.check_proof(challenge, frame)
    assert listener.pending() == 0


def test_wire_forms() -> None:
    """v2:<32 hex> out, v2:<32 hex>:<64 hex> back, PSC-AUTH v2:<64 hex> first frame; no secret on the wire."""
    dialler, listener = pair()
    offer = dialler.offer("a")
    challenge = listener.challenge(offer.header(), "a", "b")
    frame = dialler.prove(offer, challenge.header(), "b")
    version, nonce = offer.header().split(":")
    assert (version, len(nonce)) == ("v2", 32)
    version, nonce, mac = challenge.header().split(":")
    assert (version, len(nonce), len(mac)) == ("v2", 32, 64)
    assert frame.startswith(PROOF_PREFIX) and len(frame) == len(PROOF_PREFIX) + 64
    for text in (offer.header(), challenge.header(), frame.decode()):
        assert SECRET.decode() not in text and SECRET.hex() not in text


def test_proof_for_one_node_refused_by_another() -> None:
    """A proof made for node b (a real exchange) does not open node c, whatever c's challenge."""
    dialler, b = pair()
    c = LinkAuth(SECRET, random_bytes=Counter(2 << 64))
    _, frame = exchange(dialler, b, "a", "b")
    challenge_c = c.challenge(dialler.offer("a").header(), "a", "c")
    assert refused(c.check_proof, challenge_c, frame) is Refusal.BAD_MAC


def test_proof_replayed_with_the_same_offer_refused() -> None:
    """Replaying the whole dialler side (offer header and proof frame) meets a new listener nonce: refused.

    This is also what a restart looks like: the listener keeps no state, and a
    fresh nonce per connection makes every captured proof useless.
    """
    dialler, listener = pair()
    offer = dialler.offer("a")
    first = listener.challenge(offer.header(), "a", "b")
    frame = dialler.prove(offer, first.header(), "b")
    listener.check_proof(first, frame)
    restarted = LinkAuth(SECRET)
    for node in (listener, restarted):
        again = node.challenge(offer.header(), "a", "b")
        assert again.listener_nonce != first.listener_nonce
        assert refused(node.check_proof, again, frame) is Refusal.BAD_MAC


def test_proof_names_the_dialler() -> None:
    """A proof checked against a challenge for another claimed dialler id is refused."""
    dialler, listener = pair()
    offer = dialler.offer("a")
    challenge = listener.challenge(offer.header(), "a", "b")
    frame = dialler.prove(offer, challenge.header(), "b")
    impostor = listener.challenge(offer.header(), "mallory", "b")
    assert refused(listener.check_proof, impostor, frame) is Refusal.BAD_MAC


def test_wrong_secret_dialler_never_proves() -> None:
    """A dialler with another secret finds the listener's answer wrong and makes no proof."""
    dialler, listener = pair(OTHER)
    offer = dialler.offer("a")
    challenge = listener.challenge(offer.header(), "a", "b")
    assert refused(dialler.prove, offer, challenge.header(), "b") is Refusal.BAD_MAC


def test_listener_without_the_secret_gets_no_proof() -> None:
    """An answer that is missing, malformed, for another offer or node, or from another secret: no proof."""
    dialler, listener = pair()
    offer, other_offer = dialler.offer("a"), dialler.offer("a")
    answer = listener.challenge(offer.header(), "a", "b").header()
    stranger = LinkAuth(OTHER).challenge(offer.header(), "a", "b").header()
    cases = [
        (None, offer, "b", Refusal.MISSING),
        ("v2:nothex", offer, "b", Refusal.MALFORMED),
        (answer, other_offer, "b", Refusal.BAD_MAC),
        (answer, offer, "c", Refusal.BAD_MAC),
        (stranger, offer, "b", Refusal.BAD_MAC),
    ]
    for header, for_offer, node, expected in cases:
        assert refused(dialler.prove, for_offer, header, node) is expected, (header, node)


def test_answer_cannot_stand_in_for_a_proof() -> None:
    """The answer and proof MACs are domain-separated: a listener's answer mac is no proof (no reflection)."""
    dialler, listener = pair()
    offer = dialler.offer("b")
    # Claiming to be b itself makes the answer's fields equal the proof's; only the label differs.
    challenge = listener.challenge(offer.header(), "b", "b")
    mac = challenge.header().split(":")[2]
    assert refused(listener.check_proof, challenge, PROOF_PREFIX + mac.encode()) is Refusal.BAD_MAC


def test_missing_offer_is_401_and_old_version_403() -> None:
    """No header: MISSING (HTTP 401); a v1 proof: OLD_VERSION (403) with a reason naming the upgrade."""
    _, listener = pair()
    assert refused(listener.challenge, None, "a", "b") is Refusal.MISSING
    v1 = "v1:1700000000:" + "0" * 32 + ":" + "0" * 64
    assert refused(listener.challenge, v1, "a", "b") is Refusal.OLD_VERSION
    assert Refusal.MISSING.http_status == 401 and Refusal.OLD_VERSION.http_status == 403
    assert "upgrade" in Refusal.OLD_VERSION.value
    assert listener.pending() == 0


@pytest.mark.parametrize(
    "header",
    ["", "v2", "v2:" + "0" * 31, "v2:" + "0" * 33, "v2:" + "G" * 32, "v3:" + "0" * 32, "x" * (MAX_HEADER_LENGTH + 1)],
)
def test_malformed_offer_refused(header: str) -> None:
    """Anything but v2:<32 lower-case hex> is refused as malformed and holds no slot."""
    _, listener = pair()
    assert refused(listener.challenge, header, "a", "b") is Refusal.MALFORMED
    assert listener.pending() == 0


@pytest.mark.parametrize(
    "frame",
    [b"", b"PSC-AUTH v2:", PROOF_PREFIX + b"0" * 63, PROOF_PREFIX + b"0" * 64 + b"\n", b'[101, "0.1"]'],
)
def test_malformed_proof_frame_refused(frame: bytes) -> None:
    """A first frame that is not PSC-AUTH v2:<64 hex> is malformed; the slot is freed either way."""
    dialler, listener = pair()
    challenge, _ = exchange(dialler, listener)
    assert refused(listener.check_proof, challenge, frame) is Refusal.MALFORMED
    assert listener.pending() == 0


def test_pending_challenges_are_bounded() -> None:
    """Past max_pending answered-but-unproven connections, offers get BUSY (503) until one settles."""
    dialler, listener = pair(max_pending=2)
    first = listener.challenge(dialler.offer("a").header(), "a", "b")
    listener.challenge(dialler.offer("a").header(), "a", "b")
    assert refused(listener.challenge, dialler.offer("a").header(), "a", "b") is Refusal.BUSY
    assert Refusal.BUSY.http_status == 503
    listener.settle(first)
    listener.settle(first)
    listener.challenge(dialler.offer("a").header(), "a", "b")
    assert listener.pending() == 2


@given(st.text(max_size=MAX_HEADER_LENGTH + 20))
def test_junk_offer_never_raises_anything_else(header: str) -> None:
    """No random header raises anything but AuthRefused, and any accepted one is exactly v2:<32 hex>."""
    listener = LinkAuth(SECRET)
    try:
        challenge = listener.challenge(header, "a", "b")
    except AuthRefused:
        return
    assert header.strip() == f"v2:{challenge.dialler_nonce}"


@given(st.binary(max_size=200))
def test_junk_proof_never_accepted(frame: bytes) -> None:
    """No random first frame is accepted as a proof."""
    dialler, listener = pair()
    challenge, _ = exchange(dialler, listener)
    with pytest.raises(AuthRefused):
        listener.check_proof(challenge, frame)


def test_short_secret_rejected() -> None:
    """Secrets under 16 bytes are refused when the LinkAuth is made."""
    with pytest.raises(ValueError, match="at least 16 bytes"):
        LinkAuth(b"short")


def test_line_break_in_node_id_rejected() -> None:
    """A node id with a line break cannot take part (it would make the MAC input ambiguous)."""
    dialler, listener = pair()
    with pytest.raises(ValueError):
        dialler.offer("a\nb")
    assert refused(listener.challenge, dialler.offer("a").header(), "a\nb", "b") is Refusal.MALFORMED
