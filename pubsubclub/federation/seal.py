"""Sealed PSC frames: AES-256-GCM with per-link, per-direction keys and counter nonces, sans-IO.

With a cluster secret, every frame of a link after the proof frame is sealed
(docs/protocol.md, "Sealed frames"). The keys come from HKDF-SHA256 over the
secret, salted with both handshake nonces and bound to everything both MACs
of the exchange cover (node ids, the dialled URL, the route), one key per
direction. The nonce is the frame's number in its direction (0, 1, 2, ...),
never sent: each side counts, so a frame dropped, repeated, reordered,
altered, made with another key or moved to the other direction fails to open,
and the link is closed. A relay between two nodes forwards ciphertext it can
neither read nor change.

This module does no I/O and imports no Twisted; the keys are injected (or
derived by :func:`derive_keys` from what the exchange agreed).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: Bytes a sealed frame adds to its plaintext (the GCM tag; the nonce is not sent).
SEAL_OVERHEAD = 16
#: Key length in bytes (AES-256).
KEY_BYTES = 32
#: HKDF ``info`` label; the exchange's fields follow it, one per line.
KDF_LABEL = b"pubsubclub link-seal v3"
#: Frames one direction of a link may carry; the 96-bit nonce holds the count, so it never repeats.
MAX_FRAMES = (1 << 64) - 1


class SealError(Exception):
    """A sealed frame did not open: altered, replayed, reordered, dropped before it, or another key."""


def derive_keys(secret: bytes, salt: bytes, info: bytes) -> tuple[bytes, bytes]:
    """(dialler-to-listener key, listener-to-dialler key) from the secret and the exchange.

    ``salt`` is both nonces, ``info`` the exchange's fields after :data:`KDF_LABEL`
    (see :meth:`pubsubclub.federation.auth.Exchange.seal_for`).
    """
    okm = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_BYTES, salt=salt, info=KDF_LABEL + b"\n" + info).derive(secret)
    return okm[:KEY_BYTES], okm[KEY_BYTES:]


class LinkSeal:
    """Seals what one end of a link sends and opens what it receives, each direction with its own key and count."""

    __slots__ = ("_open", "_received", "_seal", "_sent")

    def __init__(self, send_key: bytes, receive_key: bytes) -> None:
        if len(send_key) != KEY_BYTES or len(receive_key) != KEY_BYTES:
            raise ValueError(f"link keys are {KEY_BYTES} bytes")
        if send_key == receive_key:
            # Both directions on one key would let a relay reflect a frame back to its sender.
            raise ValueError("the two directions of a link need different keys")
        self._seal = AESGCM(send_key).encrypt
        self._open = AESGCM(receive_key).decrypt
        self._sent = 0
        self._received = 0

    def seal(self, plaintext: bytes) -> bytes:
        """The sealed frame carrying ``plaintext`` (16 bytes longer); the next frame gets the next number."""
        n = self._sent
        if n >= MAX_FRAMES:
            raise SealError("this link has sealed all the frames its nonces allow; reconnect")
        self._sent = n + 1
        return self._seal(n.to_bytes(12, "big"), plaintext, None)

    def open(self, sealed: bytes) -> bytes:
        """The plaintext of the peer's next sealed frame; :class:`SealError` if it is not exactly that frame."""
        n = self._received
        if n >= MAX_FRAMES:
            raise SealError("this link has opened all the frames its nonces allow; reconnect")
        try:
            plaintext = self._open(n.to_bytes(12, "big"), sealed, None)
        except InvalidTag:
            raise SealError(
                f"sealed frame {n} did not open: altered, replayed, reordered, lost before it or another key"
            ) from None
        self._received = n + 1
        return plaintext

    @property
    def sent(self) -> int:
        """Frames sealed so far."""
        return self._sent

    @property
    def received(self) -> int:
        """Frames opened so far."""
        return self._received
