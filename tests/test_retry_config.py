"""``[federation] reconnect-initial`` / ``reconnect-max``: how a node redials a peer, on a MemoryReactorClock."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from twisted.internet.testing import MemoryReactorClock

from pubsubclub.cli.command import parser
from pubsubclub.config import ConfigError, node_config
from pubsubclub.core.hub import Hub
from pubsubclub.federation.retry import RetryPolicy
from pubsubclub.frontends.bridge.frontend import build as build_bridge
from pubsubclub.node.node import build_federation, frontend_context, retry_policy
from pubsubclub.testing import MemoryNetwork, no_logged_errors, psc_url

STEP = 0.005
PORT = 9002  # nothing listens there: every dial is refused


def _policy(*flags: str) -> RetryPolicy:
    """The retry policy a node started with ``flags`` uses (its federation is built with it)."""
    config = node_config(parser().parse_args(["node", *flags]))
    federation = build_federation(Hub("a"), config, MemoryReactorClock())
    assert federation._retry == retry_policy(config)
    return retry_policy(config)


def _redial_gaps(policy: RetryPolicy, count: int, rand: Callable[[], float]) -> list[float]:
    """Seconds between the first ``count`` + 1 dials of a node whose every dial is refused."""
    net = MemoryNetwork(retry=policy)
    with no_logged_errors():
        node = net.node("a", 9001, rand=rand)
        node.add_server(psc_url(PORT))
        assert net.dials() == 1
        gaps = []
        for _ in range(count):
            assert net.refuse(PORT) == 1 and net.dials() == 0  # a refused dial leaves the list
            start = net.reactor.seconds()
            for _step in range(int(policy.max_delay * 2 / STEP) + 10):  # bounded: the cap with full jitter, and more
                net.advance(STEP)
                if net.dials():
                    break
            assert net.dials() == 1, "no redial within twice the cap"
            gaps.append(net.reactor.seconds() - start)
        net.stop()
    return gaps


@pytest.mark.parametrize(("flags", "initial"), [((), 1.0), (("--reconnect-initial", "0.2"), 0.2)])
def test_first_redial_after_reconnect_initial(flags: tuple[str, ...], initial: float) -> None:
    """A refused dial is retried after reconnect-initial (default 1 s), spread by at most the jitter."""
    policy = _policy(*flags)
    assert policy.initial == initial and policy.max_delay == 10.0
    rng = random.Random(7)
    gaps = [_redial_gaps(policy, 1, rng.random)[0] for _ in range(5)]
    for gap in gaps:
        assert initial * (1 - policy.jitter) - STEP <= gap <= initial * (1 + policy.jitter) + STEP, gaps
    # Without jitter (rand 0.5) exactly the initial delay, to the step.
    [exact] = _redial_gaps(policy, 1, lambda: 0.5)
    assert exact == pytest.approx(initial, abs=STEP * 1.5)


def test_reconnect_max_caps_the_backoff() -> None:
    """Each failure waits longer by the factor, never more than reconnect-max (plus the jitter)."""
    policy = _policy("--reconnect-initial", "0.2", "--reconnect-max", "0.5")
    assert (policy.initial, policy.max_delay) == (0.2, 0.5)
    gaps = _redial_gaps(policy, 6, lambda: 0.5)
    expected = [0.2, 0.3, 0.45, 0.5, 0.5, 0.5]
    assert gaps == pytest.approx(expected, abs=STEP * 1.5)
    worst = _redial_gaps(policy, 6, lambda: 1.0)  # the largest jitter every time
    assert max(worst) == pytest.approx(0.5 * (1 + policy.jitter), abs=STEP * 1.5)


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        (("--reconnect-initial", "2", "--reconnect-max", "1"), "reconnect-max"),
        (("--reconnect-initial", "0.01"), "reconnect-initial"),
        (("--reconnect-initial", "61"), "reconnect-initial"),
        (("--reconnect-initial", "20"), "reconnect-max"),  # above the default cap of 10 s
    ],
)
def test_bad_reconnect_settings_are_refused(flags: tuple[str, ...], key: str) -> None:
    """A first delay out of bounds, or a cap below the first delay, is a config error naming the key."""
    with pytest.raises(ConfigError) as e:
        _policy(*flags)
    assert e.value.key == key


def test_bridge_redials_its_router_on_the_same_schedule() -> None:
    """pubsubclub bridge redials its WAMP router with [federation] reconnect-initial / reconnect-max too."""
    argv = ["bridge", "--router", "ws://127.0.0.1:1/ws", "--reconnect-initial", "0.3", "--reconnect-max", "2"]
    config = node_config(parser().parse_args(argv))
    reactor = MemoryReactorClock()
    hub = Hub("bridge")
    federation = build_federation(hub, config, reactor)
    bridge = build_bridge(hub, config.bridge, frontend_context(config, reactor, federation=federation))
    assert bridge._retry == RetryPolicy(initial=0.3, max_delay=2.0) == federation._retry
