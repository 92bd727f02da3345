"""One PubSubClub link as a sans-IO state machine.

A :class:`LinkSession` is fed the text of each WebSocket message with
:meth:`LinkSession.receive` and writes through an injected ``send`` callable.
It knows the handshake and which messages each role may send; what to do with
an open link (send interest, deliver publishes) is the owner's business,
reached through :class:`LinkOwner`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from pubsubclub.core.jsonbounds import _DIGIT_MASK, _LONG_RUN
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import psc, psc_logins, psc_retain, psc_rpc


class Role(enum.Enum):
    """Which side of the protocol this end of a link plays."""

    #: Sends PSC101, then PSC201/PSC202; receives PSC301.
    CONSUMER = "consumer"
    #: Answers PSC102; receives PSC201/PSC202; sends PSC301.
    PRODUCER = "producer"

    @property
    def opposite(self) -> Role:
        """The role of the peer."""
        return Role.PRODUCER if self is Role.CONSUMER else Role.CONSUMER


class LinkState(enum.Enum):
    """Lifecycle of a link."""

    #: Transport open, version not yet agreed.
    HANDSHAKING = "handshaking"
    #: Version agreed; interest and publishes flow.
    OPEN = "open"
    #: Closed or failed; nothing more is sent or accepted.
    CLOSED = "closed"


#: Read per frame received: bound once, as a member read off its enum class goes through EnumType.__getattr__'s
#: slot (a few hundred instructions each time).
_CONSUMER = Role.CONSUMER
_OPEN = LinkState.OPEN


class LinkError(Exception):
    """The peer broke the protocol; close the link with ``code`` and this message."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


#: WebSocket close codes used on PSC links (application range 4000-4999).
CLOSE_BAD_MESSAGE = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NO_COMMON_VERSION = 4406
CLOSE_DUPLICATE = 4409
CLOSE_REMOVED = 4410
CLOSE_SELF = 4508
#: Failed logins between the processes of one node (federation/psc_logins.py): accepted on such links only.
_LOGIN_MESSAGES = (psc_logins.FailedLogin, psc_logins.LoginTable)
#: ``sizes`` of :meth:`LinkSession._receive_publishes` before its first run (never changed).
_NO_SIZES: list[int] = []
#: :meth:`LinkSession._receive_publishes`' ``first`` when its first part is still to be read.
_UNREAD = object()
#: psc.BATCH_SEPARATOR's byte as an integer: ``_NEWLINE in data`` is its ``in`` without the TypeError CPython's
#: ``bytes in bytes`` raises and clears inside (it tries the operand as an integer first; about 2,000 instructions).
_NEWLINE = psc.BATCH_SEPARATOR[0]
#: jsonbounds' digit mask, and "[" for both opening brackets: a frame's digit runs and openers in one translate.
_DIGITS_AND_OPENERS = bytes(91 if b in b"[{" else m for b, m in enumerate(_DIGIT_MASK))


class LinkOwner(Protocol):
    """What a session calls back into (the federation)."""

    def link_open(self, session: LinkSession) -> None:
        """The handshake finished."""

    def link_received(self, session: LinkSession, message: psc.Publish) -> None:
        """A consumer link received a PSC301."""

    def link_received_batch(self, session: LinkSession, messages: list[psc.Publish], sizes: list[int]) -> None:
        """A consumer link received these PSC301s in a row of one 0.4 frame (``sizes``: each one's bytes).

        Deliver them in order, as :meth:`link_received` would one by one, and
        stop when ``session`` closes meanwhile (as a frame's remaining
        messages are never handled then).
        """

    # Optional: ``link_received_plain(session, topic, message, origin, published_at, message_id, wamp_wrapped,
    # seq, size)``, a lone PSC301 as nodes write it (metadata without "b"/"p") that the link accepts, as its
    # fields: what link_received_batch(session, [Publish(...)], [size]) does, without the Publish and Meta.

    def link_subscribed(self, session: LinkSession, topics: tuple[str, ...]) -> None:
        """A producer link's consumer asked for ``topics``."""

    def link_unsubscribed(self, session: LinkSession, topic: str) -> None:
        """A producer link's consumer no longer wants ``topic``."""

    def link_pattern(self, session: LinkSession, pattern: Pattern, added: bool) -> None:
        """A 0.5 producer link's consumer added (PSC203) or removed (PSC204) a pattern."""

    def link_resume(self, session: LinkSession, message: psc.Resume) -> None:
        """A 0.3 producer link's consumer sent its position and interest (PSC103)."""

    def link_position(self, session: LinkSession, message: psc.Position) -> None:
        """A 0.3 consumer link's producer said where its stream continues (PSC104)."""

    def link_rpc(self, session: LinkSession, message: psc.ExtensionMessage) -> None:
        """A 0.7 link received an RPC message (federation/psc_rpc.py) its peer's role may send."""

    def link_retained(self, session: LinkSession, message: psc_retain.Retained) -> None:
        """A 0.8 consumer link received a retained event (PSC501, federation/psc_retain.py)."""

    def link_logins(self, session: LinkSession, message: psc_logins.FailedLogin | psc_logins.LoginTable) -> None:
        """A link between two processes of one node received failed logins (PSC601/602, federation/logins.py)."""

    def link_dropped(self, session: LinkSession, error: psc.PSCPayloadError) -> None:
        """A consumer link received a PSC301 whose message breaks the JSON bounds; it was dropped."""


class LinkSession:
    """Protocol state of one link, independent of any transport."""

    def __init__(
        self,
        role: Role,
        send: Callable[[bytes], None],
        owner: LinkOwner,
        peer: str,
        versions: tuple[psc.Version, ...] = psc.SUPPORTED_VERSIONS,
        limits: psc.Limits = psc.DEFAULT_LIMITS,
    ) -> None:
        self.role = role
        self.peer = peer
        #: The peer's node id, when the transport learned it.
        self.peer_node: str | None = None
        #: With a cluster secret: the dialler dialled the URL the listener advertises, under both MACs
        #: (not an alias or a relay). A direct link is preferred to an indirect one to the same node.
        self.direct = False
        self.state = LinkState.HANDSHAKING
        #: Size of the last message received (for metrics).
        self.last_size = 0
        self.version: psc.Version | None = None
        #: PSC301 on this link carries the 0.2 metadata.
        self.with_metadata = False
        #: This link speaks the 0.3 replay extension (numbered PSC301, PSC103/PSC104).
        self.with_replay = False
        #: Frames on this link may carry several messages, one per line (0.4).
        self.batched = False
        #: This link carries pattern interest (0.5: PSC203/PSC204, patterns in PSC103).
        self.with_patterns = False
        #: This link carries messages holding binary values (0.6: ``"b": 1`` in PSC301 metadata).
        self.with_binary = False
        #: This link carries RPC (0.7: PSC401-PSC406, federation/psc_rpc.py).
        self.with_rpc = False
        #: This link carries retained events (0.8: PSC501, federation/psc_retain.py).
        self.with_retained = False
        #: Topics the consumer at the other end asked for (producer role).
        self.topics: set[str] = set()
        #: Patterns the consumer at the other end asked for (producer role, 0.5).
        self.patterns: set[Pattern] = set()
        #: 0.3: PSC103 (producer role) or PSC104 (consumer role) was received.
        self.resumed = False
        #: The consumer at the other end has sent its first PSC201 (producer role).
        self.topics_heard = False
        #: A link to one of this node's own workers (federation/relay.py): messages on it are relayed.
        self.worker = False
        #: A link between two processes of one node (a primary and one of its workers): failed logins cross it.
        self.same_node = False
        self._send = send
        self._owner = owner
        self._versions = versions
        self._limits = limits
        #: ``limits.max_link_frame`` (a property), read once per frame received.
        self._max_frame = limits.max_link_frame
        #: The most opening brackets a line may hold and still be bounded (jsonbounds.text_within, wrapper depth 1).
        self._depth_bound = limits.json.max_depth + 1
        #: The owner's ``link_received_plain`` (see :class:`LinkOwner`), if it has one.
        self._received_plain: Callable[..., None] | None = getattr(owner, "link_received_plain", None)

    def __repr__(self) -> str:
        return f"<LinkSession {self.role.value} peer={self.peer} {self.state.value}>"

    def _speak(self, version: psc.Version) -> None:
        """Take ``version`` for this link and what it implies (plain attributes: read per message)."""
        self.version = version
        self.with_metadata = version >= psc.V0_2
        self.with_replay = version >= psc.V0_3
        self.batched = version >= psc.V0_4
        self.with_patterns = version >= psc.V0_5
        self.with_binary = version >= psc.V0_6
        self.with_rpc = version >= psc.V0_7
        self.with_retained = version >= psc.V0_8

    def start(self) -> None:
        """The transport opened: the consumer speaks first, whoever dialled."""
        if self.role is Role.CONSUMER:
            self._send(psc.encode(psc.Hello(self._versions)))

    def close(self) -> None:
        """The transport closed."""
        self.state = LinkState.CLOSED
        self.topics.clear()
        self.patterns.clear()

    def send(self, message: psc.Message) -> None:
        """Send ``message`` if the link is open (else drop it: at-most-once)."""
        if self.state is LinkState.OPEN:
            self._send(psc.encode(message))

    def send_raw(self, data: bytes) -> None:
        """Send an already-encoded message if the link is open."""
        if self.state is LinkState.OPEN:
            self._send(data)

    def receive(self, data: bytes) -> None:
        """Handle one frame from the peer (several messages on a 0.4 link); raise :class:`LinkError` on violations."""
        if self.batched and _NEWLINE in data:
            # One bounds check for the whole frame, not one per message.
            bounded = psc.batch_within_bounds(data, self._limits)
            parts = data.split(psc.BATCH_SEPARATOR)
            if self.role is Role.CONSUMER and self.state is LinkState.OPEN:
                self._receive_publishes(parts, bounded)
                return
            for part in parts:
                if not part:
                    raise LinkError(CLOSE_BAD_MESSAGE, "bad PSC batch: an empty line")
                if self.state is LinkState.CLOSED:
                    return
                self._receive_one(part, bounded)
            return
        if data and self.role is _CONSUMER and self.state is _OPEN:
            # A lone message on an open consumer link (a PSC301, most often): the batch reader's
            # in-place read, after the same bounds check; anything else it hands to _receive_one.
            self.last_size = size = len(data)
            # The scan bounds each line's depth: a frame of several lines before 0.4 (one message
            # with newlines in it) is checked whole by decode instead. (Here a 0.4 frame has no
            # newline.) text_within's one-line case, without its call (once per frame):
            if _NEWLINE in data:
                bounded = False
            else:
                # One pass maps digits to "1" and both opening brackets to "[": the run of 19 digits and the
                # count of openers read off one copy (text_within reads each off the frame itself).
                marks = data.translate(_DIGITS_AND_OPENERS)
                bounded = marks.find(_LONG_RUN) < 0 and marks.count(b"[") <= self._depth_bound
            plain = self._received_plain
            if (
                plain is not None
                and bounded
                and size <= self._max_frame
                and (self.resumed if self.with_replay else self.with_metadata)
            ):
                # _receive_publishes' in-place read of a PSC301 as nodes write it, for the one message a paced
                # link's frame holds, without its call (the same checks in the same order; what it would not
                # hand to link_received_plain goes on to it, with the value read here).
                try:
                    value = orjson.loads(data)
                except orjson.JSONDecodeError:
                    value = None
                if type(value) is list and len(value) == 4 and value[0] == psc.PUBLISH and type(value[0]) is int:
                    topic, fields = value[1], value[3]
                    if (
                        type(topic) is str
                        and topic
                        and len(topic) <= self._limits.max_topic_length
                        and type(fields) is dict
                        and "o" in fields
                        and "t" in fields
                        and "i" in fields
                        and "b" not in fields
                        and "p" not in fields
                    ):
                        t, o, i = fields["t"], fields["o"], fields["i"]
                        w = fields["w"] if "w" in fields else 0
                        q = fields["s"] if "s" in fields else None
                        if (
                            type(t) is float
                            and 0.0 <= t <= psc.MAX_PUBLISH_TIME
                            and type(o) is str
                            and type(i) is str
                            and type(w) is int
                            and (w == 0 or w == 1)
                            and (q is None or (type(q) is int and 0 < q <= psc.MAX_SEQ))
                            and (q is not None or not self.with_replay)
                        ):
                            plain(self, topic, value[2], o, t, i, w == 1, q, size)
                            return
                self._receive_publishes((data,), bounded, value)
                return
            self._receive_publishes((data,), bounded)
            return
        self._receive_one(data)

    def _receive_publishes(self, parts: list[bytes] | tuple[bytes], bounded: bool, first: Any = _UNREAD) -> None:
        """An open consumer's batch: runs of acceptable PSC301s go to the owner together, the rest one by one.

        Same outcome as :meth:`_receive_one` on each line in turn: a line that
        is not a PSC301 this link accepts now (a PSC104, a bad or dropped
        message, an empty line) is handled alone after the run before it.
        ``first``: what ``orjson.loads`` (None where it raised) made of the
        first part, already read (:meth:`receive`'s lone frame).
        """
        limits = self._limits
        decode, publish, meta_class = psc.decode, psc.Publish, psc.Meta
        loads, max_frame, max_topic = orjson.loads, self._max_frame, limits.max_topic_length
        # Made at a run's first message: a lone message read as its fields makes neither.
        run: list[psc.Publish] | None = None
        sizes = _NO_SIZES  # never appended to: replaced with the run's own list with ``run``
        # A frame of one message that the link accepts goes to the owner as its fields (no Publish, Meta, lists).
        plain = self._received_plain if len(parts) == 1 else None
        for part in parts:
            if part:
                message: psc.Message | None = None
                size = len(part)
                if bounded and size <= max_frame:
                    # A PSC301 as nodes write it (metadata without "b"/"p"), read in place: what
                    # psc.decode makes of it, without its two calls; anything else takes decode().
                    if first is _UNREAD:
                        try:
                            value = loads(part)
                        except orjson.JSONDecodeError:
                            value = None
                    else:
                        value, first = first, _UNREAD
                    if type(value) is list and len(value) == 4 and value[0] == psc.PUBLISH and type(value[0]) is int:
                        topic, fields = value[1], value[3]
                        if (
                            type(topic) is str
                            and topic
                            and len(topic) <= max_topic
                            and type(fields) is dict
                            # "o", "t", "i" present and no "b"/"p" key at all (a null one takes decode()):
                            # read by subscript, not seven dict.get calls per line.
                            and "o" in fields
                            and "t" in fields
                            and "i" in fields
                            and "b" not in fields
                            and "p" not in fields
                        ):
                            t, o, i = fields["t"], fields["o"], fields["i"]
                            w = fields["w"] if "w" in fields else 0
                            q = fields["s"] if "s" in fields else None
                            if (
                                type(t) is float
                                and 0.0 <= t <= psc.MAX_PUBLISH_TIME
                                and type(o) is str
                                and type(i) is str
                                and type(w) is int
                                and (w == 0 or w == 1)
                                and (q is None or (type(q) is int and 0 < q <= psc.MAX_SEQ))
                            ):
                                if plain is not None and (
                                    (self.resumed and q is not None) if self.with_replay else self.with_metadata
                                ):
                                    # The run below of this one message, without its objects.
                                    plain(self, topic, value[2], o, t, i, w == 1, q, size)
                                    return
                                message = publish(topic, value[2], meta_class(o, t, i, w == 1, q))
                if message is None:
                    try:
                        message = decode(part, limits, bounded)
                    except psc.PSCDecodeError:
                        message = None
                if type(message) is publish:
                    meta = message.meta
                    if (
                        (self.resumed and meta is not None and meta.seq is not None)
                        if self.with_replay
                        else (meta is None or self.with_metadata)
                    ):
                        if run is None:
                            run, sizes = [message], [size]
                        else:
                            run.append(message)
                            sizes.append(size)
                        continue
            if run:
                self._owner.link_received_batch(self, run, sizes)
                run = None
            if not part:
                raise LinkError(CLOSE_BAD_MESSAGE, "bad PSC batch: an empty line")
            if self.state is LinkState.CLOSED:
                return
            if message is None:
                self._receive_one(part, bounded)  # decoded again, for its error
            else:
                # Decoded above (an RPC answer, most often): not a second time.
                self.last_size = len(part)
                self._dispatch(message)
        if run:
            self._owner.link_received_batch(self, run, sizes)

    def _receive_one(self, data: bytes, bounded: bool = False) -> None:
        if self.state is LinkState.CLOSED:
            return
        self.last_size = len(data)
        try:
            message = psc.decode(data, self._limits, bounded)
        except psc.PSCPayloadError as e:
            if self.state is LinkState.OPEN and self.role is Role.CONSUMER:
                # A producer relays what its clients (or an older node) sent:
                # drop that one message, keep the link for everything else.
                self._owner.link_dropped(self, e)
                return
            raise LinkError(CLOSE_BAD_MESSAGE, f"bad PSC message: {e}") from None
        except psc.PSCDecodeError as e:
            raise LinkError(CLOSE_BAD_MESSAGE, f"bad PSC message: {e}") from None
        self._dispatch(message)

    def _dispatch(self, message: psc.Message) -> None:
        """One decoded message, by the link's state and role."""
        if isinstance(message, psc_retain.Retained):
            if not (self.with_retained and self.state is LinkState.OPEN and self.role is Role.CONSUMER):
                raise self._unexpected(message)
            self._owner.link_retained(self, message)
        elif isinstance(message, psc.ExtensionMessage):
            if isinstance(message, _LOGIN_MESSAGES):
                open_consumer = self.state is LinkState.OPEN and self.role is Role.CONSUMER
                if not (self.same_node and self.with_rpc and open_consumer):
                    raise self._unexpected(message)
                self._owner.link_logins(self, message)
                return
            allowed = psc_rpc.FROM_CONSUMER if self.role is Role.PRODUCER else psc_rpc.FROM_PRODUCER
            if not (self.with_rpc and self.state is LinkState.OPEN and isinstance(message, allowed)):
                raise self._unexpected(message)
            self._owner.link_rpc(self, message)
        elif self.state is LinkState.HANDSHAKING:
            self._handshake(message)
        elif self.with_replay and self._replay_step(message):
            return
        elif self.role is Role.CONSUMER:
            if not isinstance(message, psc.Publish):
                raise self._unexpected(message)
            if message.meta is not None and not self.with_metadata:
                raise LinkError(CLOSE_BAD_MESSAGE, "PSC301 metadata is not part of version 0.1")
            self._owner.link_received(self, message)
        elif isinstance(message, psc.Subscribe):
            self.topics.update(message.topics)
            self._owner.link_subscribed(self, message.topics)
        elif isinstance(message, psc.Unsubscribe):
            self.topics.discard(message.topic)
            self._owner.link_unsubscribed(self, message.topic)
        elif isinstance(message, (psc.SubscribePattern, psc.UnsubscribePattern)) and self.with_patterns:
            self._pattern_step(message)
        else:
            raise self._unexpected(message)

    def _pattern_step(self, message: psc.SubscribePattern | psc.UnsubscribePattern) -> None:
        """0.5, producer role: PSC203 adds a pattern (within the per-peer limit), PSC204 removes one."""
        pattern = message.pattern
        if isinstance(message, psc.UnsubscribePattern):
            self.patterns.discard(pattern)
            self._owner.link_pattern(self, pattern, False)
            return
        if pattern not in self.patterns:
            limit = self._limits.max_patterns_per_peer
            if len(self.patterns) >= limit:
                raise LinkError(CLOSE_BAD_MESSAGE, f"PSC203 over the limit of {limit} patterns per peer")
            self.patterns.add(pattern)
        self._owner.link_pattern(self, pattern, True)

    def _replay_step(self, message: psc.Message) -> bool:
        """0.3 rules: PSC103 opens the producer's side, PSC104 the consumer's; True when handled here."""
        if self.role is Role.PRODUCER:
            if self.resumed:
                return False
            if not isinstance(message, psc.Resume):
                raise LinkError(
                    CLOSE_BAD_MESSAGE, f"a 0.3 consumer must send PSC103 first, got {type(message).__name__}"
                )
            if message.patterns is not None and not self.with_patterns:
                raise LinkError(CLOSE_BAD_MESSAGE, "PSC103 patterns are not part of versions below 0.5")
            self.resumed = True
            self.topics.update(message.topics)
            self.patterns.update(message.patterns or ())
            self._owner.link_resume(self, message)
            return True
        if isinstance(message, psc.Position) and not self.resumed:
            self.resumed = True
            self._owner.link_position(self, message)
            return True
        if isinstance(message, psc.Publish):
            if not self.resumed:
                raise LinkError(CLOSE_BAD_MESSAGE, "PSC301 before PSC104 on a 0.3 link")
            if message.meta is None or message.meta.seq is None:
                raise LinkError(CLOSE_BAD_MESSAGE, "PSC301 on a 0.3 link needs metadata with a sequence number 's'")
        return False

    def _handshake(self, message: psc.Message) -> None:
        if self.role is Role.PRODUCER:
            if not isinstance(message, psc.Hello):
                raise self._unexpected(message)
            chosen = psc.choose_version(message.versions, self._versions)
            if chosen is None:
                offered = ", ".join(f"{a}.{b}" for a, b in message.versions)
                ours = ", ".join(f"{a}.{b}" for a, b in self._versions)
                raise LinkError(CLOSE_NO_COMMON_VERSION, f"no common version: peer offers {offered}, we speak {ours}")
            self._send(psc.encode(psc.ChooseVersion(chosen)))
        else:
            if not isinstance(message, psc.ChooseVersion):
                raise self._unexpected(message)
            if message.version not in self._versions:
                raise LinkError(
                    CLOSE_NO_COMMON_VERSION,
                    f"producer chose version {message.version[0]}.{message.version[1]}, which we did not offer",
                )
            chosen = message.version
        self._speak(chosen)
        self.state = LinkState.OPEN
        self._owner.link_open(self)

    def _unexpected(self, message: psc.Message) -> LinkError:
        name = type(message).__name__
        return LinkError(
            CLOSE_BAD_MESSAGE,
            f"unexpected {name} from a {self.role.opposite.value} while {self.state.value}",
        )
