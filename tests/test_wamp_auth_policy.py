"""The auth policy module in memory: the file, the roles, the HELLO/CHALLENGE/AUTHENTICATE machine.

Client answers are computed with Autobahn's own client-side helpers
(``AuthWampCra``, ``derive_key``, ``CryptosignKey``), so the router side is
checked against the code real clients run.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
import txaio
from autobahn.wamp.auth import AuthWampCra, derive_key
from autobahn.wamp.cryptosign import CryptosignKey
from autobahn.wamp.types import Challenge as ClientChallenge

from pubsubclub.frontends.wamp.auth import (
    AUTHENTICATION_FAILED,
    NOT_AUTHORIZED,
    Authenticator,
    AuthFileError,
    AuthPolicy,
    AuthState,
    AuthStateError,
    Challenge,
    Cryptosign,
    Deny,
    Principal,
    Role,
    Ticket,
    WampCra,
    Welcome,
    load_auth,
    parse_auth,
)

txaio.use_twisted()

#: The contract's example file, verbatim.
CONTRACT_EXAMPLE = """\
anonymous = "guest"          # role for sessions without credentials; false refuses them
[roles.guest]
subscribe = ["public."]      # URI prefixes this role may subscribe to; "" means all
publish = []
[roles.writer]
subscribe = [""]
publish = ["app.", "public."]
[[principals]]
authid = "alice"
role = "writer"
ticket = "s3cret"            # or wampcra = "secret", or cryptosign = "<hex Ed25519 public key>"
"""

CAROL_SEED = bytes(range(32))
CAROL = CryptosignKey.from_bytes(CAROL_SEED)
MALLORY = CryptosignKey.from_bytes(bytes(range(1, 33)))
DAVE_KEY = derive_key("dave-password", "pepper", 100, 16).decode("ascii")

POLICY = AuthPolicy(
    roles=(
        Role("guest", subscribe=("public.",), publish=()),
        Role("writer", subscribe=("",), publish=("app.", "public.")),
    ),
    principals=(
        Principal("alice", "writer", Ticket("s3cret")),
        Principal("bob", "writer", WampCra("bob-secret")),
        Principal("carol", "guest", Cryptosign(str(CAROL.public_key()))),
        Principal("dave", "writer", WampCra(DAVE_KEY, salt="pepper", iterations=100, keylen=16)),
    ),
    anonymous="guest",
)
CLOSED = AuthPolicy(roles=POLICY.roles, principals=POLICY.principals, anonymous=None)


def counting_bytes() -> Any:
    """A deterministic ``random_bytes``: each call returns fresh bytes (1, 2, 3, ... repeated)."""
    counter = itertools.count(1)

    def random_bytes(n: int) -> bytes:
        return bytes([next(counter) % 256]) * n

    return random_bytes


def authenticator(policy: AuthPolicy = POLICY, **kwargs: Any) -> Authenticator:
    """An authenticator with injected randomness and a fixed clock."""
    return Authenticator(policy, random_bytes=kwargs.pop("random_bytes", counting_bytes()), clock=lambda: 1e9)


def client_challenge(challenge: Challenge) -> ClientChallenge:
    """Our CHALLENGE as Autobahn's client sees it."""
    return ClientChallenge(challenge.method, dict(challenge.extra))


def signed(key: CryptosignKey, challenge: Challenge) -> str:
    """Autobahn's cryptosign answer to ``challenge`` (sync: PyNaCl signs at once)."""
    results: list[str] = []
    key.sign_challenge(client_challenge(challenge)).addCallback(results.append)
    return results[0]


# -- the file ---------------------------------------------------------------------------


def test_contract_example_parses_to_roles_and_principals() -> None:
    """The example file of the contract gives its two roles, one ticket principal and the anonymous role."""
    policy = parse_auth(CONTRACT_EXAMPLE)
    assert policy.anonymous == "guest"
    assert policy.role("guest") == Role("guest", ("public.",), ())
    assert policy.role("writer") == Role("writer", ("",), ("app.", "public."))
    assert policy.principals == (Principal("alice", "writer", Ticket("s3cret")),)
    assert policy.anonymous_role == policy.role("guest")


def test_prefixes_are_string_prefixes_and_empty_means_all() -> None:
    """``public.`` grants ``public.x`` but not ``publicity``; ``""`` grants every topic; ``[]`` none."""
    policy = parse_auth(CONTRACT_EXAMPLE)
    assert policy.may_subscribe("guest", "public.news")
    assert not policy.may_subscribe("guest", "publicity")
    assert not policy.may_subscribe("guest", "app.x")
    assert not policy.may_publish("guest", "public.news")
    assert policy.may_subscribe("writer", "anything.at.all")
    assert policy.may_subscribe("writer", "$realm.r2#t")
    assert policy.may_publish("writer", "app.x") and not policy.may_publish("writer", "other.x")
    assert not policy.may_publish("nosuchrole", "app.x")


@pytest.mark.parametrize("anonymous", ["anonymous = false\n", ""])
def test_anonymous_false_or_absent_refuses_anonymous(anonymous: str) -> None:
    """``anonymous = false`` and no ``anonymous`` key both refuse sessions without credentials."""
    policy = parse_auth(anonymous + CONTRACT_EXAMPLE.split("\n", 1)[1])
    assert policy.anonymous is None and policy.anonymous_role is None


def test_every_credential_kind_and_salted_wampcra_parse() -> None:
    """Ticket, plain and salted WAMP-CRA and a cryptosign key (any hex case) are read."""
    key = str(CAROL.public_key())
    policy = parse_auth(
        f"""
[roles.r]
publish = ["a."]
[[principals]]
authid = "t"
role = "r"
ticket = "tt"
[[principals]]
authid = "w"
role = "r"
wampcra = "ww"
[[principals]]
authid = "s"
role = "r"
wampcra = "derived"
salt = "pepper"
iterations = 100
keylen = 16
[[principals]]
authid = "c"
role = "r"
cryptosign = "{key.upper()}"
"""
    )
    assert [p.credential for p in policy.principals] == [
        Ticket("tt"),
        WampCra("ww"),
        WampCra("derived", salt="pepper", iterations=100, keylen=16),
        Cryptosign(key),
    ]
    assert policy.principal_by_key(key.upper()) == policy.principal("c")
    assert policy.anonymous is None


GOOD = CONTRACT_EXAMPLE


def _replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


BAD_FILES = [
    # (file text, line named, words in the message)
    (_replace("[roles.writer]", "[roles.writer"), 5, "invalid TOML"),
    # An unclosed array: TOML finds the problem on the next line.
    (_replace('publish = ["app.", "public."]', 'publish = ["app.", '), 8, "invalid TOML"),
    (_replace('role = "writer"', 'role = "wrtier"'), 10, "unknown role 'wrtier'"),
    (_replace('anonymous = "guest"', 'anonymous = "visitor"'), 1, "'visitor' is not defined"),
    (_replace('anonymous = "guest"', "anonymous = true"), 1, "role name or false"),
    (_replace('ticket = "s3cret"', ""), 8, "has no credential"),
    (GOOD + 'wampcra = "other"\n', 12, "has 2 credentials"),
    (_replace('ticket = "s3cret"', 'cryptosign = "abc123"'), 11, "64 hex characters"),
    (_replace('ticket = "s3cret"', 'cryptosign = "' + "zz" * 32 + '"'), 11, "64 hex characters"),
    (_replace("publish = []", 'publish = "public."'), 4, "must be a list"),
    (_replace('subscribe = [""]', "subscribe = [1]"), 6, "must be a list"),
    (_replace('ticket = "s3cret"', "ticket = 42"), 11, "non-empty string"),
    (_replace('authid = "alice"', "authid = 7"), 9, "authid must be a string"),
    (_replace('ticket = "s3cret"', 'tickt = "s3cret"'), 11, "unknown key 'tickt'"),
    (_replace("publish = []", 'publsh = ["x."]'), 4, "unknown key 'publsh'"),
    ("colour = 'blue'\n" + GOOD, 1, "unknown key 'colour'"),
    (GOOD + '[[principals]]\nauthid = "alice"\nrole = "guest"\nticket = "x"\n', 13, "listed twice"),
    (_replace('ticket = "s3cret"', 'ticket = "s3cret"\nsalt = "x"'), 12, "only goes with wampcra"),
    (_replace('ticket = "s3cret"', 'wampcra = "k"\niterations = 5'), 12, "needs a salt"),
    (_replace('ticket = "s3cret"', 'wampcra = "k"\nsalt = "x"\nkeylen = 0'), 13, "keylen must be"),
    ('roles = "none"\n', 1, "roles must be a table"),
    ("[roles]\nguest = 3\n", 2, "must be a table"),
    ('[roles.r]\n[[principals]]\nauthid = "a"\nrole = "r"\nticket = """multi\nline"""\nnope = 1\n', 7, "'nope'"),
]


@pytest.mark.parametrize(("text", "line", "words"), BAD_FILES)
def test_bad_files_name_the_line(text: str, line: int, words: str) -> None:
    """Syntax and schema errors raise AuthFileError naming the line of the offending key or table."""
    with pytest.raises(AuthFileError) as caught:
        parse_auth(text)
    assert caught.value.line == line, str(caught.value)
    assert words in caught.value.problem
    assert str(caught.value).startswith(f"line {line}: ")


def test_duplicate_cryptosign_keys_are_refused() -> None:
    """Two principals with one key would make a key-only HELLO ambiguous: refused at the second."""
    key = str(CAROL.public_key())
    text = f'[roles.r]\n[[principals]]\nauthid = "a"\nrole = "r"\ncryptosign = "{key}"\n'
    text += f'[[principals]]\nauthid = "b"\nrole = "r"\ncryptosign = "{key}"\n'
    with pytest.raises(AuthFileError, match="line 9: .*also principal #1"):
        parse_auth(text)


def test_load_auth_reports_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    """A missing file and a file that is not UTF-8 are AuthFileErrors, the latter with its line."""
    with pytest.raises(AuthFileError, match="cannot read"):
        load_auth(str(tmp_path / "missing.toml"))
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"anonymous = false\n[roles.r]\n# caf\xe9\n")
    with pytest.raises(AuthFileError) as caught:
        load_auth(str(path))
    assert caught.value.line == 3
    path.write_text(CONTRACT_EXAMPLE)
    assert load_auth(str(path)) == parse_auth(CONTRACT_EXAMPLE)


def test_policy_refuses_inconsistent_construction() -> None:
    """Building an AuthPolicy in code checks the same references the parser does."""
    with pytest.raises(ValueError, match="unknown role"):
        AuthPolicy(roles=(Role("r"),), principals=(Principal("a", "x", Ticket("t")),))
    with pytest.raises(ValueError, match="not a role"):
        AuthPolicy(roles=(Role("r"),), anonymous="x")


# -- the authenticator ---------------------------------------------------------------------


def test_anonymous_hello_is_welcomed_with_the_anonymous_role() -> None:
    """HELLO without authmethods, or with ``anonymous``, gets WELCOME authid/authrole/authmethod."""
    for methods in (None, ["anonymous"]):
        auth = authenticator()
        assert auth.hello(methods) == Welcome("anonymous", "guest", "anonymous")
        assert auth.state is AuthState.DONE


def test_anonymous_refused_is_not_authorized() -> None:
    """With ``anonymous = false`` a HELLO without credentials is denied with not_authorized."""
    outcome = authenticator(CLOSED).hello(None)
    assert isinstance(outcome, Deny) and outcome.reason == NOT_AUTHORIZED
    assert "anonymous" in outcome.message


def test_ticket_right_and_wrong() -> None:
    """The right ticket is welcomed as alice/writer/ticket; a wrong one fails authentication."""
    auth = authenticator()
    assert auth.hello(["ticket"], "alice") == Challenge("ticket", {})
    assert auth.state is AuthState.AWAIT_AUTHENTICATE
    assert auth.authenticate("s3cret") == Welcome("alice", "writer", "ticket")
    auth = authenticator()
    auth.hello(["ticket"], "alice")
    assert auth.authenticate("s3cret!") == Deny(AUTHENTICATION_FAILED, "ticket authentication failed for 'alice'")
    auth = authenticator()
    auth.hello(["ticket"], "alice")
    assert isinstance(auth.authenticate(None), Deny)


def test_wampcra_right_and_wrong_with_autobahns_client() -> None:
    """Autobahn's AuthWampCra with the right secret is welcomed; with a wrong one it fails."""
    auth = authenticator()
    challenge = auth.hello(["wampcra"], "bob", session_id=77)
    assert isinstance(challenge, Challenge) and challenge.method == "wampcra"
    details = json.loads(challenge.extra["challenge"])
    assert details["authid"] == "bob" and details["session"] == 77
    assert details["nonce"] == "01" * 16 and details["timestamp"] == "2001-09-09T01:46:40.000000Z"
    answer = AuthWampCra(authid="bob", secret="bob-secret").on_challenge(None, client_challenge(challenge))
    assert auth.authenticate(answer) == Welcome("bob", "writer", "wampcra")
    auth = authenticator()
    challenge = auth.hello(["wampcra"], "bob")
    assert isinstance(challenge, Challenge)
    wrong = AuthWampCra(authid="bob", secret="not-it").on_challenge(None, client_challenge(challenge))
    outcome = auth.authenticate(wrong)
    assert isinstance(outcome, Deny) and outcome.reason == AUTHENTICATION_FAILED


def test_salted_wampcra_tells_the_salt_and_checks_the_derived_key() -> None:
    """A salted secret sends salt/iterations/keylen; Autobahn's client derives the key from the password."""
    auth = authenticator()
    challenge = auth.hello(["wampcra"], "dave")
    assert isinstance(challenge, Challenge)
    assert (challenge.extra["salt"], challenge.extra["iterations"], challenge.extra["keylen"]) == ("pepper", 100, 16)
    answer = AuthWampCra(authid="dave", secret="dave-password").on_challenge(None, client_challenge(challenge))
    assert auth.authenticate(answer) == Welcome("dave", "writer", "wampcra")


def test_cryptosign_right_and_wrong_key() -> None:
    """Carol's key signs the challenge and is welcomed; another key fails authentication."""
    auth = authenticator()
    challenge = auth.hello(["cryptosign"], "carol", {"pubkey": CAROL.public_key()})
    assert isinstance(challenge, Challenge) and challenge.method == "cryptosign"
    assert len(bytes.fromhex(challenge.extra["challenge"])) == 32
    assert challenge.extra["channel_binding"] is None
    assert auth.authenticate(signed(CAROL, challenge)) == Welcome("carol", "guest", "cryptosign")
    auth = authenticator()
    challenge = auth.hello(["cryptosign"], "carol", {"pubkey": MALLORY.public_key()})
    assert isinstance(challenge, Challenge)
    outcome = auth.authenticate(signed(MALLORY, challenge))
    assert isinstance(outcome, Deny) and outcome.reason == AUTHENTICATION_FAILED


def test_cryptosign_by_public_key_alone() -> None:
    """Without an authid the principal is found by the pubkey in authextra."""
    auth = authenticator()
    challenge = auth.hello(["cryptosign"], None, {"pubkey": CAROL.public_key()})
    assert isinstance(challenge, Challenge)
    assert auth.authenticate(signed(CAROL, challenge)) == Welcome("carol", "guest", "cryptosign")
    outcome = authenticator().hello(["cryptosign"], None, {"pubkey": MALLORY.public_key()})
    assert isinstance(outcome, Deny) and outcome.reason == NOT_AUTHORIZED


@pytest.mark.parametrize("bad", ["", "zz", "00" * 64, "00" * 96, "00" * 200])
def test_cryptosign_garbage_signatures_fail(bad: str) -> None:
    """Signatures that are not hex, or wrong in length or value, fail authentication without raising."""
    auth = authenticator()
    auth.hello(["cryptosign"], "carol")
    outcome = auth.authenticate(bad)
    assert isinstance(outcome, Deny) and outcome.reason == AUTHENTICATION_FAILED


def test_cryptosign_signature_without_the_message_is_accepted() -> None:
    """The bare 64-byte signature (without the challenge appended) also checks out."""
    auth = authenticator()
    challenge = auth.hello(["cryptosign"], "carol")
    assert isinstance(challenge, Challenge)
    assert auth.authenticate(signed(CAROL, challenge)[:128]) == Welcome("carol", "guest", "cryptosign")


def test_cryptosign_channel_binding_is_refused() -> None:
    """A client asking for tls-unique channel binding is told it is unsupported."""
    outcome = authenticator().hello(["cryptosign"], "carol", {"channel_binding": "tls-unique"})
    assert isinstance(outcome, Deny) and "channel binding" in outcome.message


def test_challenges_are_random_per_session() -> None:
    """Two sessions never see the same challenge (real randomness: os.urandom)."""
    seen = set()
    for _ in range(20):
        for authid, method in (("carol", "cryptosign"), ("bob", "wampcra")):
            challenge = Authenticator(POLICY).hello([method], authid)
            assert isinstance(challenge, Challenge)
            seen.add(challenge.extra["challenge"])
    assert len(seen) == 40


def test_replaying_an_old_answer_fails() -> None:
    """An answer to one session's challenge does not authenticate another session."""
    first = authenticator(random_bytes=os.urandom)
    challenge = first.hello(["cryptosign"], "carol")
    assert isinstance(challenge, Challenge)
    answer = signed(CAROL, challenge)
    second = authenticator(random_bytes=os.urandom)
    second.hello(["cryptosign"], "carol")
    outcome = second.authenticate(answer)
    assert isinstance(outcome, Deny) and outcome.reason == AUTHENTICATION_FAILED


def test_unknown_authid_and_no_acceptable_method_are_not_authorized() -> None:
    """Unknown authid, a method the principal has no credential for, or only unknown methods: not_authorized."""
    for methods, authid, words in (
        (["ticket"], "nobody", "no principal 'nobody'"),
        (["wampcra"], "alice", "no acceptable authmethod"),
        (["scram", "tls"], "alice", "no acceptable authmethod"),
        (["ticket"], None, "need an authid"),
    ):
        outcome = authenticator(CLOSED).hello(methods, authid)
        assert isinstance(outcome, Deny), methods
        assert outcome.reason == NOT_AUTHORIZED and words in outcome.message


def test_methods_are_tried_in_the_clients_order() -> None:
    """The first method the policy can serve wins: anonymous first stays anonymous, skipped ones are passed."""
    assert authenticator().hello(["anonymous", "ticket"], "alice") == Welcome("anonymous", "guest", "anonymous")
    assert authenticator().hello(["wampcra", "ticket"], "alice") == Challenge("ticket", {})
    assert authenticator(CLOSED).hello(["anonymous", "ticket"], "alice") == Challenge("ticket", {})


def test_out_of_order_calls_are_our_bug() -> None:
    """authenticate() before a challenge, or hello() twice, raise AuthStateError."""
    auth = authenticator()
    with pytest.raises(AuthStateError):
        auth.authenticate("x")
    auth.hello(None)
    with pytest.raises(AuthStateError):
        auth.hello(None)
    with pytest.raises(AuthStateError):
        auth.authenticate("x")


def test_junk_hello_fields_do_not_crash() -> None:
    """Non-string methods, a non-string authid and a non-dict authextra are treated as absent."""
    auth = authenticator(CLOSED)
    outcome = auth.hello([1, None, "ticket"], 5, "not a dict")  # type: ignore[list-item, arg-type]
    assert isinstance(outcome, Deny) and outcome.reason == NOT_AUTHORIZED
