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
from pubsubclub.federation.seal import SealError

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
    return challenge, dialler.prove(offer, challenge.header(), b).frame


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
    """v3:<32 hex> out, v3:<32 hex>:<route>:<64 hex> back, PSC-AUTH v3:<64 hex> first frame; no secret on the wire."""
    dialler, listener = pair()
    offer = dialler.offer("a")
    challenge = listener.challenge(offer.header(), "a", "b")
    frame = dialler.prove(offer, challenge.header(), "b").frame
    version, nonce = offer.header().split(":")
    assert (version, len(nonce)) == ("v3", 32)
    version, nonce, route, mac = challenge.header().split(":")
    assert (version, len(nonce), route, len(mac)) == ("v3", 32, "indirect", 64)
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
    frame = dialler.prove(offer, first.header(), "b").frame
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
    frame = dialler.prove(offer, challenge.header(), "b").frame
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
        ("v3:nothex", offer, "b", Refusal.MALFORMED),
        (answer.replace("indirect", "direct"), offer, "b", Refusal.BAD_MAC),
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
    mac = challenge.header().split(":")[3]
    assert refused(listener.check_proof, challenge, PROOF_PREFIX + mac.encode()) is Refusal.BAD_MAC


def test_missing_offer_is_401_and_old_version_403() -> None:
    """No header: MISSING (HTTP 401); a v1 proof or a v2 (unsealed) offer: OLD_VERSION (403) naming the upgrade."""
    _, listener = pair()
    assert refused(listener.challenge, None, "a", "b") is Refusal.MISSING
    v1 = "v1:1700000000:" + "0" * 32 + ":" + "0" * 64
    assert refused(listener.challenge, v1, "a", "b") is Refusal.OLD_VERSION
    assert refused(listener.challenge, "v2:" + "0" * 32, "a", "b") is Refusal.OLD_VERSION
    assert Refusal.MISSING.http_status == 401 and Refusal.OLD_VERSION.http_status == 403
    assert "upgrade" in Refusal.OLD_VERSION.value
    assert listener.pending() == 0


@pytest.mark.parametrize(
    "header",
    ["", "v3", "v3:" + "0" * 31, "v3:" + "0" * 33, "v3:" + "G" * 32, "v4:" + "0" * 32, "x" * (MAX_HEADER_LENGTH + 1)],
)
def test_malformed_offer_refused(header: str) -> None:
    """Anything but v3:<32 lower-case hex> is refused as malformed and holds no slot."""
    _, listener = pair()
    assert refused(listener.challenge, header, "a", "b") is Refusal.MALFORMED
    assert listener.pending() == 0


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"PSC-AUTH v3:",
        b"PSC-AUTH v2:" + b"0" * 64,
        PROOF_PREFIX + b"0" * 63,
        PROOF_PREFIX + b"0" * 64 + b"\n",
        b'[101, "0.1"]',
    ],  # fmt: skip
)
def test_malformed_proof_frame_refused(frame: bytes) -> None:
    """A first frame that is not PSC-AUTH v3:<64 hex> is malformed; the slot is freed either way."""
    dialler, listener = pair()
    challenge, _ = exchange(dialler, listener)
    assert refused(listener.check_proof, challenge, frame) is Refusal.MALFORMED
    assert listener.pending() == 0


def test_pending_challenges_per_source_evict_that_sources_oldest() -> None:
    """Past max_pending_per_source from one address, a new offer evicts that address's oldest; others keep theirs."""
    dialler, listener = pair(max_pending=10, max_pending_per_source=2)
    gone: list[str] = []

    def offer(source: str, name: str) -> Challenge:
        return listener.challenge(
            dialler.offer("a").header(), "a", "b", source=source, on_evict=lambda: gone.append(name)
        )

    other = offer("10.0.0.2", "other")
    first = offer("10.0.0.1", "first")
    offer("10.0.0.1", "second")
    assert gone == [] and listener.pending("10.0.0.1") == 2
    third = offer("10.0.0.1", "third")
    assert gone == ["first"] and listener.pending("10.0.0.1") == 2 and listener.pending() == 3
    assert listener.evicted == 1
    # The evicted challenge no longer counts; settling it again changes nothing.
    listener.settle(first)
    assert listener.pending() == 3
    listener.settle(third)
    listener.settle(other)
    assert listener.pending() == 1 and gone == ["first"]


def test_newest_attempt_from_a_flooded_address_still_proves() -> None:
    """Any number of never-proving offers from an address before a real one: the real one proves and is sealed."""
    dialler, listener = pair(max_pending=4, max_pending_per_source=2)
    for _ in range(300):
        listener.challenge(dialler.offer("x").header(), "x", "b", source="127.0.0.1")
    offer = dialler.offer("a")
    challenge = listener.challenge(offer.header(), "a", "b", source="127.0.0.1")
    proven = dialler.prove(offer, challenge.header(), "b")
    seal = listener.check_proof(challenge, proven.frame)
    assert seal.open(proven.seal.seal(b"[101,[0,1]]")) == b"[101,[0,1]]"
    assert listener.pending() == 1 and listener.evicted == 299


def test_pending_challenges_node_wide_evict_the_biggest_holders_oldest() -> None:
    """Past max_pending in all, a new offer evicts the oldest challenge of the address holding the most."""
    dialler, listener = pair(max_pending=3, max_pending_per_source=3)
    gone: list[str] = []
    for name, source in (("x1", "x"), ("y1", "y"), ("y2", "y")):
        listener.challenge(dialler.offer("a").header(), "a", "b", source=source, on_evict=lambda n=name: gone.append(n))
    listener.challenge(dialler.offer("a").header(), "a", "b", source="z")
    assert gone == ["y1"] and listener.pending() == 3
    assert (listener.pending("x"), listener.pending("y"), listener.pending("z")) == (1, 1, 1)


def test_route_is_direct_only_for_an_advertised_url_and_bound_by_both_macs() -> None:
    """The route says whether the dialled URL is the listener's own; changing it or the URL breaks the MACs."""
    dialler, listener = pair()
    own = ("ws://10.0.0.2:9001/psc",)
    for url, route in ((own[0], "direct"), ("ws://relay:9999/psc", "indirect"), ("", "indirect")):
        offer = dialler.offer("a", url)
        challenge = listener.challenge(offer.header(), "a", "b", dialled_url=url, own_urls=own)
        assert challenge.route == route
        proven = dialler.prove(offer, challenge.header(), "b")
        assert proven.direct is (route == "direct")
        listener.check_proof(challenge, proven.frame)
    # A relay that tells the listener another dialled URL (to look direct) breaks the answer for the dialler.
    offer = dialler.offer("a", "ws://relay:9999/psc")
    forged = listener.challenge(offer.header(), "a", "b", dialled_url=own[0], own_urls=own)
    assert refused(dialler.prove, offer, forged.header(), "b") is Refusal.BAD_MAC
    # Nor can a proof made for one route or URL be checked against the other.
    honest = listener.challenge(offer.header(), "a", "b", dialled_url="ws://relay:9999/psc", own_urls=own)
    frame = dialler.prove(offer, honest.header(), "b").frame
    assert refused(listener.check_proof, forged, frame) is Refusal.BAD_MAC


def test_both_ends_agree_on_the_seal() -> None:
    """The dialler's and the listener's seals open each other's frames in both directions, and nothing else."""
    dialler, listener = pair()
    offer = dialler.offer("a", "ws://b/psc")
    challenge = listener.challenge(offer.header(), "a", "b", dialled_url="ws://b/psc")
    proven = dialler.prove(offer, challenge.header(), "b")
    at_listener = listener.check_proof(challenge, proven.frame)
    at_dialler = proven.seal
    assert at_listener.open(at_dialler.seal(b"up")) == b"up"
    assert at_dialler.open(at_listener.seal(b"down")) == b"down"
    # Another exchange between the same nodes derives other keys.
    again = dialler.offer("a", "ws://b/psc")
    second = listener.challenge(again.header(), "a", "b", dialled_url="ws://b/psc")
    other = dialler.prove(again, second.header(), "b").seal
    with pytest.raises(SealError):
        at_listener.open(other.seal(b"up"))


def test_bad_pending_caps_rejected() -> None:
    """Caps below one are refused when the LinkAuth is made."""
    with pytest.raises(ValueError):
        LinkAuth(SECRET, max_pending_per_source=0)


@given(st.text(max_size=MAX_HEADER_LENGTH + 20))
def test_junk_offer_never_raises_anything_else(header: str) -> None:
    """No random header raises anything but AuthRefused, and any accepted one is exactly v3:<32 hex>."""
    listener = LinkAuth(SECRET)
    try:
        challenge = listener.challenge(header, "a", "b")
    except AuthRefused:
        return
    assert header.strip() == f"v3:{challenge.dialler_nonce}"


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
