"""The router's URI check remembers good URIs within a bound and always answers as uri_problem does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.core.hub import Hub
from pubsubclub.frontends.wamp.broker import URI_CACHE_SIZE, UriCheck, WampLimits, WampRouter, uri_problem

URIS = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="ab.$# \ud800", max_size=12),
    st.from_regex(r"[a-z]{1,5}(\.[a-z]{1,5}){0,3}", fullmatch=True),
)


@given(st.lists(URIS, max_size=40))
def test_same_answers_as_uri_problem_asked_twice(uris: list[str]) -> None:
    """Differential: every URI, asked once and again (cached or not), gets uri_problem's answer."""
    check = UriCheck(max_length=16, size=8)
    for uri in uris + uris:
        assert check(uri) == uri_problem(uri, 16)
    assert len(check) <= 8


def test_bounded_oldest_first_and_bad_uris_never_kept() -> None:
    """Past its size the oldest good URI goes; a bad URI is not remembered, so it is refused every time."""
    check = UriCheck(max_length=512, size=3)
    for topic in ("a.one", "a.two", "a.three", "a.four"):
        assert check(topic) is None
    assert len(check) == 3
    assert "a.one" not in check._good and "a.four" in check._good
    for _ in range(2):
        assert check("bad topic") is not None
        assert check("$cluster.gap") is not None
    assert len(check) == 3


def test_the_limit_is_the_routers() -> None:
    """A router checks against its own max_uri_length, with the default cache size."""
    router = WampRouter(Hub("n"), limits=WampLimits(max_uri_length=10))
    assert router.uri_problem("a.b") is None
    assert router.uri_problem("a.bcdefghijk") == uri_problem("a.bcdefghijk", 10) is not None
    assert router.uri_problem.size == URI_CACHE_SIZE
