"""Sealed PSC frames, sans-IO: what a relay between two nodes can and cannot do to the bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.federation.seal import KEY_BYTES, SEAL_OVERHEAD, LinkSeal, SealError, derive_keys

SECRET = b"a cluster secret, long enough.."


def ends(salt: bytes = b"\x01" * 32, info: bytes = b"a\nb") -> tuple[LinkSeal, LinkSeal]:
    """The dialler's and the listener's seals of one exchange."""
    to_listener, to_dialler = derive_keys(SECRET, salt, info)
    return LinkSeal(to_listener, to_dialler), LinkSeal(to_dialler, to_listener)


def test_round_trip_both_ways_and_no_plaintext() -> None:
    """Each end opens the other's frames in order; a sealed frame is 16 bytes longer and hides its text."""
    dialler, listener = ends()
    for i in range(3):
        message = b'[301,"secret.topic","MARKER-%d"]' % i
        sealed = dialler.seal(message)
        assert len(sealed) == len(message) + SEAL_OVERHEAD
        assert b"MARKER" not in sealed and b"secret.topic" not in sealed
        assert listener.open(sealed) == message
        assert dialler.open(listener.seal(message)) == message
    assert dialler.sent == listener.received == 3


def test_same_plaintext_seals_differently_each_time() -> None:
    """Two frames with the same text differ on the wire (the nonce is the frame's number)."""
    dialler, _ = ends()
    assert dialler.seal(b"same") != dialler.seal(b"same")


@pytest.mark.parametrize("position", [0, 5, -1])
def test_tampered_frame_fails(position: int) -> None:
    """One bit flipped anywhere (text or tag) and the frame does not open."""
    dialler, listener = ends()
    sealed = bytearray(dialler.seal(b'[301,"t","hello"]'))
    sealed[position] ^= 0x01
    with pytest.raises(SealError, match="did not open"):
        listener.open(bytes(sealed))


def test_replayed_frame_fails() -> None:
    """A frame delivered a second time does not open: its number is used up."""
    dialler, listener = ends()
    first = dialler.seal(b"one")
    assert listener.open(first) == b"one"
    with pytest.raises(SealError):
        listener.open(first)


def test_reordered_frames_fail() -> None:
    """Frames swapped in transit do not open."""
    dialler, listener = ends()
    first, second = dialler.seal(b"one"), dialler.seal(b"two")
    with pytest.raises(SealError):
        listener.open(second)
    # A failed frame does not advance the count: the first still opens (the transport closes the link anyway).
    assert listener.open(first) == b"one"


def test_dropped_frame_fails_the_next() -> None:
    """A relay that holds back one frame cannot deliver the next."""
    dialler, listener = ends()
    dialler.seal(b"dropped")
    with pytest.raises(SealError):
        listener.open(dialler.seal(b"next"))


def test_wrong_key_fails() -> None:
    """A frame sealed for another exchange (other nonces) or with another secret does not open."""
    dialler, _ = ends()
    _, other_listener = ends(salt=b"\x02" * 32)
    with pytest.raises(SealError):
        other_listener.open(dialler.seal(b"x"))
    keys = derive_keys(b"another secret, long enough....", b"\x01" * 32, b"a\nb")
    stranger = LinkSeal(keys[0], keys[1])
    _, listener = ends()
    with pytest.raises(SealError):
        listener.open(stranger.seal(b"x"))


def test_reflected_frame_fails() -> None:
    """A frame sent back to its own sender (the other direction) does not open: one key per direction."""
    dialler, _ = ends()
    with pytest.raises(SealError):
        dialler.open(dialler.seal(b"echo"))


def test_injected_junk_fails() -> None:
    """Bytes a relay makes up (empty, short, long) never open."""
    _, listener = ends()
    for junk in (b"", b"x" * 15, b"x" * 16, b'[301,"t","injected"]' + b"\0" * 16):
        with pytest.raises(SealError):
            listener.open(junk)


@given(st.binary(max_size=300))
def test_random_bytes_never_open(junk: bytes) -> None:
    """No random frame opens."""
    _, listener = ends()
    with pytest.raises(SealError):
        listener.open(junk)


def test_keys_differ_by_direction_and_exchange() -> None:
    """Two 32-byte keys per exchange, different from each other and from another exchange's."""
    a = derive_keys(SECRET, b"\x01" * 32, b"a\nb")
    b = derive_keys(SECRET, b"\x01" * 32, b"a\nc")
    assert len(a[0]) == len(a[1]) == KEY_BYTES and a[0] != a[1]
    assert set(a).isdisjoint(b)


def test_one_key_for_both_directions_refused() -> None:
    """A seal with the same key both ways (reflection possible) or a short key is a programming error."""
    with pytest.raises(ValueError):
        LinkSeal(b"k" * KEY_BYTES, b"k" * KEY_BYTES)
    with pytest.raises(ValueError):
        LinkSeal(b"k" * 16, b"j" * 16)
