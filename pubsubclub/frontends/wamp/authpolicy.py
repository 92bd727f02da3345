"""The authorization policy and its file: roles, principals, credentials, and the TOML parser, sans-IO.

The policy comes from one TOML file (``--auth FILE``)::

    anonymous = "guest"          # role for sessions without credentials; false refuses them
    [roles.guest]
    subscribe = ["public."]      # hub-topic prefixes this role may subscribe to; "" means all
    publish = []
    [roles.writer]
    subscribe = [""]
    publish = ["app.", "public."]
    [[principals]]
    authid = "alice"
    role = "writer"
    ticket = "s3cret"            # or wampcra = "secret", or cryptosign = "<hex Ed25519 public key>"

    [realms.sales]               # a further WAMP realm: its own anonymous role, roles and principals
    anonymous = false
    [realms.sales.roles.clerk]
    subscribe = ["orders."]      # WAMP topic prefixes *of that realm*
    publish = ["orders."]
    [[realms.sales.principals]]
    authid = "bob"
    role = "clerk"
    ticket = "other secret"

:func:`parse_auth` turns the text into an :class:`AuthPolicy` (frozen
dataclasses) or raises :class:`AuthFileError` naming the line. A role's
prefixes are plain string prefixes of *hub* topics (the cluster-wide topic
space: a WAMP topic of the plain realm, ``tep_prefix + channel``,
``nsd_prefix + channel``), so one role means the same on every front-end.

The top level is the plain realm's policy (and NSD's, TEP's, stream's).
Each ``[realms.NAME]`` table is a whole policy of its own for WAMP realm
NAME, whose prefixes are WAMP topic prefixes of that realm (the router maps
them into the realm's hub topics, :func:`~pubsubclub.frontends.wamp.uris.hub_prefix`).
A realm other than the plain one without a table admits nobody; an authid
is a different principal in each realm (being alice in one realm lets
nobody into another).

:class:`~pubsubclub.frontends.wamp.auth.Authenticator` checks a session's
credentials against it; every name here stays importable from
:mod:`pubsubclub.frontends.wamp.auth`.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, ClassVar

#: Largest policy file read, in bytes (it is a configuration file, not a database).
MAX_AUTH_FILE = 4 * 1024 * 1024
#: Longest authid or role name accepted in the file.
MAX_NAME_LENGTH = 255


class AuthFileError(ValueError):
    """The policy file is not valid; ``line`` is where (1-based), when known."""

    def __init__(self, line: int | None, problem: str) -> None:
        super().__init__(problem if line is None else f"line {line}: {problem}")
        self.line = line
        self.problem = problem


# -- the policy -------------------------------------------------------------------------


@dataclass(frozen=True)
class Role:
    """What sessions of one role may do: hub-topic prefixes for subscribe and publish."""

    name: str
    #: Hub topics starting with one of these may be subscribed to ("" matches every topic).
    subscribe: tuple[str, ...] = ()
    #: Hub topics starting with one of these may be published to.
    publish: tuple[str, ...] = ()

    # str.startswith takes the whole tuple at C speed (and is False for ()):
    # this runs once per PUBLISH and SUBSCRIBE.
    def may_subscribe(self, topic: str) -> bool:
        """True if this role may subscribe to hub ``topic``."""
        return topic.startswith(self.subscribe)

    def may_publish(self, topic: str) -> bool:
        """True if this role may publish to hub ``topic``."""
        return topic.startswith(self.publish)


@dataclass(frozen=True)
class Ticket:
    """WAMP-Ticket: the client sends this shared secret as it is (use TLS)."""

    method: ClassVar[str] = "ticket"
    ticket: str


@dataclass(frozen=True)
class WampCra:
    """WAMP-CRA: the client proves the secret with an HMAC-SHA256 of a random challenge.

    With ``salt`` set, ``secret`` is the PBKDF2-derived key (what
    ``autobahn.wamp.auth.derive_key(password, salt, iterations, keylen)``
    returns), so the file holds no password; the challenge tells the client
    the salt parameters.
    """

    method: ClassVar[str] = "wampcra"
    secret: str
    salt: str | None = None
    iterations: int = 1000
    keylen: int = 32


@dataclass(frozen=True)
class Cryptosign:
    """WAMP-cryptosign: the client signs a random challenge with its Ed25519 key."""

    method: ClassVar[str] = "cryptosign"
    #: The Ed25519 public key, 64 lower-case hex characters.
    public_key: str


Credential = Ticket | WampCra | Cryptosign
#: Principal keys that hold a credential, each naming its method.
_CREDENTIAL_KEYS = ("ticket", "wampcra", "cryptosign")


@dataclass(frozen=True)
class Principal:
    """One authid that may authenticate, its role and its one credential."""

    authid: str
    role: str
    credential: Credential


@dataclass(frozen=True)
class AuthPolicy:
    """Roles, principals and the anonymous role: everything ``--auth`` says."""

    roles: tuple[Role, ...]
    principals: tuple[Principal, ...] = ()
    #: Role of sessions without credentials; None refuses them.
    anonymous: str | None = None
    #: Further realms' own policies (``[realms.NAME]``), by realm name; their prefixes are the realm's WAMP topics.
    realms: dict[str, AuthPolicy] = field(default_factory=dict, compare=False, hash=False)
    _roles: dict[str, Role] = field(init=False, repr=False, compare=False)
    _by_authid: dict[str, Principal] = field(init=False, repr=False, compare=False)
    _by_key: dict[str, Principal] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        roles = {role.name: role for role in self.roles}
        if len(roles) != len(self.roles):
            raise ValueError("role names must be unique")
        if self.anonymous is not None and self.anonymous not in roles:
            raise ValueError(f"anonymous role {self.anonymous!r} is not a role")
        by_authid: dict[str, Principal] = {}
        by_key: dict[str, Principal] = {}
        for principal in self.principals:
            if principal.role not in roles:
                raise ValueError(f"principal {principal.authid!r} has unknown role {principal.role!r}")
            if by_authid.setdefault(principal.authid, principal) is not principal:
                raise ValueError(f"principal {principal.authid!r} is listed twice")
            if isinstance(principal.credential, Cryptosign):
                if by_key.setdefault(principal.credential.public_key, principal) is not principal:
                    raise ValueError(f"principal {principal.authid!r} shares its cryptosign key")
        object.__setattr__(self, "_roles", roles)
        object.__setattr__(self, "_by_authid", by_authid)
        object.__setattr__(self, "_by_key", by_key)

    def role(self, name: str) -> Role:
        """The role called ``name`` (KeyError if there is none)."""
        return self._roles[name]

    @property
    def anonymous_role(self) -> Role | None:
        """The role of clients without credentials, or None when they are refused."""
        return None if self.anonymous is None else self._roles[self.anonymous]

    @property
    def holds_secrets(self) -> bool:
        """True if some principal has a ticket or WAMP-CRA secret (cryptosign keys are public)."""
        return any(not isinstance(p.credential, Cryptosign) for p in self.principals)

    def principal(self, authid: str) -> Principal | None:
        """The principal with ``authid``, if any."""
        return self._by_authid.get(authid)

    def principal_by_key(self, public_key: str) -> Principal | None:
        """The cryptosign principal holding ``public_key`` (hex), if any."""
        return self._by_key.get(public_key.lower())

    def for_realm(self, realm: str, plain_realm: str) -> AuthPolicy | None:
        """The policy of WAMP ``realm`` as written (prefixes of its WAMP topics); None: the realm admits nobody.

        Its ``[realms.NAME]`` table, else the top level for the plain realm.
        """
        found = self.realms.get(realm)
        if found is not None:
            return found
        return self if realm == plain_realm else None

    def may_subscribe(self, role: str, topic: str) -> bool:
        """True if sessions of ``role`` may subscribe to hub ``topic``."""
        found = self._roles.get(role)
        return found is not None and found.may_subscribe(topic)

    def may_publish(self, role: str, topic: str) -> bool:
        """True if sessions of ``role`` may publish to hub ``topic``."""
        found = self._roles.get(role)
        return found is not None and found.may_publish(topic)


# -- parsing the file -------------------------------------------------------------------

_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_HEADER = re.compile(r"^\s*(\[\[?)\s*(.+?)\s*\]\]?\s*(?:#.*)?$")
_BARE_OR_QUOTED = r"(?:[A-Za-z0-9_-]+|\"(?:[^\"\\]|\\.)*\"|'[^']*')"
_KEY = re.compile(rf"^\s*({_BARE_OR_QUOTED}(?:\s*\.\s*{_BARE_OR_QUOTED})*)\s*=")
_HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")


def _split_key(text: str) -> tuple[str, ...]:
    """A dotted TOML key as its parts, quotes removed (good enough to find a line)."""
    parts: list[str] = []
    for match in re.finditer(_BARE_OR_QUOTED, text):
        part = match.group(0)
        if part[:1] in "\"'":
            part = part[1:-1]
        parts.append(part)
    return tuple(parts)


class _Locator:
    """Finds the line of a table or key in TOML text, for error messages.

    ``tomllib`` keeps no positions, so the text is scanned line by line for
    ``[table]`` / ``[[array]]`` headers and ``key =`` lines, tracking which
    table each key belongs to. Keys inside multi-line strings or inline tables
    are not seen; asking for one falls back to its nearest enclosing key.
    """

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[str | int, ...], int] = {}
        table: tuple[str | int, ...] = ()
        counts: dict[tuple[str, ...], int] = {}
        in_string: str | None = None
        for number, line in enumerate(text.splitlines(), 1):
            if in_string is not None:
                if line.count(in_string) % 2 == 1:
                    in_string = None
                continue
            header = _HEADER.match(line)
            if header is not None and not _KEY.match(line):
                name = _split_key(header.group(2))
                if header.group(1) == "[[":
                    index = counts.get(name, 0)
                    counts[name] = index + 1
                    table = (*name, index)
                else:
                    table = name
                self._lines.setdefault(table, number)
                continue
            key = _KEY.match(line)
            if key is not None:
                self._lines.setdefault((*table, *_split_key(key.group(1))), number)
                rest = line[key.end() :]
                for quotes in ('"""', "'''"):
                    if rest.count(quotes) % 2 == 1:
                        in_string = quotes

    def line(self, *path: str | int) -> int | None:
        """The line of ``path`` (table names, array indexes, keys), or of its nearest known parent."""
        for end in range(len(path), 0, -1):
            number = self._lines.get(path[:end])
            if number is not None:
                return number
        return None


def parse_auth(text: str) -> AuthPolicy:
    """The :class:`AuthPolicy` in TOML ``text``; :class:`AuthFileError` naming the line if invalid."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        found = _TOML_LINE.search(str(e))
        raise AuthFileError(int(found.group(1)) if found else None, f"invalid TOML: {e}") from None
    return _Schema(raw, _Locator(text)).policy()


def load_auth(path: str) -> AuthPolicy:
    """The policy in file ``path``; :class:`AuthFileError` if unreadable or invalid."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_AUTH_FILE + 1)
    except OSError as e:
        raise AuthFileError(None, f"cannot read it: {e.strerror}") from None
    if len(data) > MAX_AUTH_FILE:
        raise AuthFileError(None, f"longer than {MAX_AUTH_FILE} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise AuthFileError(line, "not UTF-8 text") from None
    return parse_auth(text)


class _Within:
    """A :class:`_Locator` seen from inside a table (``[realms.NAME]``): paths are relative to it."""

    def __init__(self, outer: _Locator | _Within, at: tuple[str | int, ...]) -> None:
        self._outer = outer
        self._at = at

    def line(self, *path: str | int) -> int | None:
        """The line of ``path`` inside the table."""
        return self._outer.line(*self._at, *path)


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return names.get(type(value), type(value).__name__)


class _Schema:
    """Checks parsed TOML against the policy schema, naming the line of each problem."""

    def __init__(self, raw: dict[str, Any], where: _Locator) -> None:
        self._raw = raw
        self._where: _Locator | _Within = where

    def _fail(self, path: tuple[str | int, ...], problem: str) -> AuthFileError:
        return AuthFileError(self._where.line(*path), problem)

    def policy(self) -> AuthPolicy:
        raw = self._raw
        for key in raw:
            if key not in ("anonymous", "roles", "principals", "realms"):
                raise self._fail((key,), f"unknown key {key!r} (expected anonymous, roles, principals, realms)")
        top = self._policy(raw, ())
        realms = raw.get("realms", {})
        if not isinstance(realms, dict):
            raise self._fail(("realms",), f"realms must be a table of [realms.NAME] tables, not {_type_name(realms)}")
        for name, body in realms.items():
            path: tuple[str | int, ...] = ("realms", name)
            if not isinstance(body, dict):
                raise self._fail(path, f"realm {name!r} must be a table, not {_type_name(body)}")
            if not name or len(name) > MAX_NAME_LENGTH or "#" in name or any(c.isspace() for c in name):
                raise self._fail(path, f"realm names must be 1-{MAX_NAME_LENGTH} characters without spaces or '#'")
            for key in body:
                if key not in ("anonymous", "roles", "principals"):
                    raise self._fail(
                        (*path, key), f"realm {name!r}: unknown key {key!r} (expected anonymous, roles, principals)"
                    )
            top.realms[name] = self._policy(body, path)
        return top

    def _policy(self, raw: dict[str, Any], at: tuple[str | int, ...]) -> AuthPolicy:
        """The policy of the top level (``at`` empty) or of one ``[realms.NAME]`` table."""
        outer = self._where
        self._where = _Within(outer, at)
        try:
            return self._one_policy(raw)
        finally:
            self._where = outer

    def _one_policy(self, raw: dict[str, Any]) -> AuthPolicy:
        roles = self._roles(raw.get("roles", {}))
        names = {role.name for role in roles}
        anonymous = raw.get("anonymous", False)
        if anonymous is False:
            anonymous_role = None
        elif isinstance(anonymous, str) and anonymous in names:
            anonymous_role = anonymous
        elif isinstance(anonymous, str):
            raise self._fail(("anonymous",), f"anonymous role {anonymous!r} is not defined under [roles]")
        else:
            raise self._fail(("anonymous",), f"anonymous must be a role name or false, not {_type_name(anonymous)}")
        principals = self._principals(raw.get("principals", []), names)
        return AuthPolicy(roles=roles, principals=principals, anonymous=anonymous_role)

    def _roles(self, value: Any) -> tuple[Role, ...]:
        if not isinstance(value, dict):
            raise self._fail(("roles",), f"roles must be a table of [roles.NAME] tables, not {_type_name(value)}")
        roles = []
        for name, body in value.items():
            path: tuple[str | int, ...] = ("roles", name)
            if not name or len(name) > MAX_NAME_LENGTH:
                raise self._fail(path, f"role names must be 1-{MAX_NAME_LENGTH} characters")
            if not isinstance(body, dict):
                raise self._fail(path, f"role {name!r} must be a table, not {_type_name(body)}")
            for key in body:
                if key not in ("subscribe", "publish"):
                    raise self._fail((*path, key), f"role {name!r}: unknown key {key!r} (expected subscribe, publish)")
            roles.append(
                Role(
                    name,
                    subscribe=self._prefixes((*path, "subscribe"), body.get("subscribe", [])),
                    publish=self._prefixes((*path, "publish"), body.get("publish", [])),
                )
            )
        return tuple(roles)

    def _prefixes(self, path: tuple[str | int, ...], value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(path, f"{path[-1]} must be a list of topic-prefix strings")
        return tuple(dict.fromkeys(value))

    def _principals(self, value: Any, roles: set[str]) -> tuple[Principal, ...]:
        if not isinstance(value, list):
            raise self._fail(("principals",), f"principals must be [[principals]] tables, not {_type_name(value)}")
        principals: list[Principal] = []
        seen: dict[str, int] = {}
        keys: dict[str, int] = {}
        for index, body in enumerate(value):
            path: tuple[str | int, ...] = ("principals", index)
            if not isinstance(body, dict):
                raise self._fail(path, f"principal #{index + 1} must be a table, not {_type_name(body)}")
            principal = self._principal(index, body, roles)
            if principal.authid in seen:
                raise self._fail(
                    (*path, "authid"),
                    f"authid {principal.authid!r} is listed twice (also principal #{seen[principal.authid] + 1})",
                )
            seen[principal.authid] = index
            if isinstance(principal.credential, Cryptosign):
                key = principal.credential.public_key
                if key in keys:
                    raise self._fail(
                        (*path, "cryptosign"),
                        f"principal {principal.authid!r}: this cryptosign key is also principal #{keys[key] + 1}'s",
                    )
                keys[key] = index
            principals.append(principal)
        return tuple(principals)

    def _principal(self, index: int, body: dict[str, Any], roles: set[str]) -> Principal:
        path: tuple[str | int, ...] = ("principals", index)
        allowed = ("authid", "role", *_CREDENTIAL_KEYS, "salt", "iterations", "keylen")
        authid = body.get("authid")
        who = f"principal {authid!r}" if isinstance(authid, str) else f"principal #{index + 1}"
        for key in body:
            if key not in allowed:
                raise self._fail((*path, key), f"{who}: unknown key {key!r} (expected {', '.join(allowed)})")
        if not isinstance(authid, str) or not authid or len(authid) > MAX_NAME_LENGTH:
            raise self._fail((*path, "authid"), f"{who}: authid must be a string of 1-{MAX_NAME_LENGTH} characters")
        role = body.get("role")
        if not isinstance(role, str):
            raise self._fail((*path, "role"), f"{who}: role must be a role name")
        if role not in roles:
            known = ", ".join(sorted(roles)) or "none"
            raise self._fail((*path, "role"), f"{who}: unknown role {role!r} (roles: {known})")
        given = [key for key in _CREDENTIAL_KEYS if key in body]
        if len(given) != 1:
            problem = "has no credential" if not given else f"has {len(given)} credentials ({', '.join(given)})"
            raise self._fail(
                (*path, given[1]) if len(given) > 1 else path,
                f"{who} {problem}: give exactly one of ticket, wampcra, cryptosign",
            )
        method = given[0]
        secret = body[method]
        if not isinstance(secret, str) or not secret:
            raise self._fail((*path, method), f"{who}: {method} must be a non-empty string")
        salted = [key for key in ("salt", "iterations", "keylen") if key in body]
        if salted and method != "wampcra":
            raise self._fail((*path, salted[0]), f"{who}: {salted[0]} only goes with wampcra")
        credential: Credential
        if method == "ticket":
            credential = Ticket(secret)
        elif method == "wampcra":
            credential = self._wampcra(path, who, secret, body)
        else:
            if not _HEX_KEY.match(secret):
                raise self._fail(
                    (*path, method), f"{who}: cryptosign must be an Ed25519 public key as 64 hex characters"
                )
            credential = Cryptosign(secret.lower())
        return Principal(authid, role, credential)

    def _wampcra(self, path: tuple[str | int, ...], who: str, secret: str, body: dict[str, Any]) -> WampCra:
        salt = body.get("salt")
        if salt is None:
            if "iterations" in body or "keylen" in body:
                raise self._fail((*path, "iterations" if "iterations" in body else "keylen"), f"{who}: needs a salt")
            return WampCra(secret)
        if not isinstance(salt, str) or not salt:
            raise self._fail((*path, "salt"), f"{who}: salt must be a non-empty string")
        numbers = {}
        for key, default, top in (("iterations", 1000, 10_000_000), ("keylen", 32, 1024)):
            number = body.get(key, default)
            if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= top:
                raise self._fail((*path, key), f"{who}: {key} must be an integer between 1 and {top}")
            numbers[key] = number
        return WampCra(secret, salt=salt, iterations=numbers["iterations"], keylen=numbers["keylen"])
