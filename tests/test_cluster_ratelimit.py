"""A key's rate limit across a cluster (docs/SCALING.md, *Rate limits*): two real `runnerd
serve` nodes on one PostgreSQL database each enforce their share of it (rate / N, burst / N,
N the live nodes), so behind a round-robin balancer the key gets its configured burst, not
N times it; a node that dies gives its share back to the others within its lease."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import httpx
import pytest

from daemon import Daemon, envelope, running_daemon, running_nodes
from pg_cluster import PgCluster
from runnerd.api.ratelimit import RateLimiter
from runnerd.errors import RateLimited
from runnerd.limits import RATE_SHARE_EVERY_S

pytestmark = pytest.mark.jail  # real nodes need nsjail (none is started: no tool runs)

BURST = 6
RATE = 0.01  # a token per 100 s: nothing refills while a test runs
LEASE_S = 3.0
LIMITS = {"rate_limit_per_second": str(RATE), "rate_limit_burst": str(BURST),
          "node_lease_s": str(LEASE_S), "warm_jails": "0"}  # fmt: skip
_people = count()


@pytest.fixture(scope="module")
def nodes(pg: PgCluster, toolchain_dir: Path) -> Iterator[tuple[Daemon, Daemon]]:
    with running_nodes(toolchain_dir, pg.new_database(), **LIMITS) as (a, b):
        _wait_for_share(a, 2)  # b counted two at its start; a counts again each second
        yield a, b


def _wait_for_share(node: Daemon, nodes: int, within_s: float = 4 * RATE_SHARE_EVERY_S) -> None:
    """Until ``node``'s log says it enforces 1/``nodes`` of each limit (its last word on it)."""
    deadline = time.monotonic() + within_s
    while _shares(node)[-1:] != [nodes]:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.url} never took its 1/{nodes} share")
        time.sleep(0.05)


def _shares(node: Daemon) -> list[int]:
    """The N of each "share is now 1/N" line of ``node``'s log, oldest first."""
    log = (node.data_dir / "serve.log").read_text()
    return [int(n) for n in re.findall(r"share is now 1/(\d+)", log)]


def _caller(node: Daemon) -> str:
    """A new person's key: a bucket of its own, full, on every node."""
    return node.person(f"rate-{next(_people)}@example.com")


def _list(node: Daemon, key: str) -> httpx.Response:
    """A call that spends one of the key's tokens and starts no run."""
    return node.call("GET", "/api/v2/apps/tools", key, params={"workspaceId": node.workspace_id})


def _retry_after(response: httpx.Response) -> int:
    error = envelope(response, 429)
    assert error["details"]["retryAfter"].endswith("Z"), error
    return int(response.headers["Retry-After"])


def test_round_robin_over_two_nodes_admits_the_configured_burst(
    nodes: tuple[Daemon, Daemon],
) -> None:
    a, b = nodes
    key = _caller(a)
    answers = [_list(node, key) for node in (a, b) * BURST]  # 2 x burst calls, alternated
    codes = [r.status_code for r in answers]
    assert codes.count(200) == BURST, codes  # per node it would be 2 x BURST: all of them
    assert codes == [200] * BURST + [429] * BURST, codes  # each node its share: BURST / 2
    for refused in answers[BURST:]:
        # The next token on this node: its share of the rate is RATE / 2 (200 s).
        assert 150 < _retry_after(refused) <= 1 / (RATE / 2), refused.headers


def test_uneven_balancing_is_refused_early_on_the_busy_node(
    nodes: tuple[Daemon, Daemon],
) -> None:
    """The documented tolerance: a node enforces its share, not the key's whole limit."""
    a, b = nodes
    key = _caller(a)
    on_a = [_list(a, key).status_code for _ in range(BURST // 2 + 1)]
    assert on_a == [200] * (BURST // 2) + [429], on_a
    on_b = [_list(b, key).status_code for _ in range(BURST // 2 + 1)]
    assert on_b == [200] * (BURST // 2) + [429], on_b


def test_a_dead_node_s_share_comes_back_to_the_others_within_its_lease(
    nodes: tuple[Daemon, Daemon], toolchain_dir: Path
) -> None:
    a, b = nodes
    with running_daemon(toolchain_dir, join=a, **LIMITS) as doomed:
        _wait_for_share(a, 3)
        _wait_for_share(b, 3)
        key = _caller(a)
        third = [_list(a, key).status_code for _ in range(BURST // 3 + 1)]
        assert third == [200] * (BURST // 3) + [429], third  # a's share of three: 2
        spent = _list(a, key)
        assert 250 < _retry_after(spent) <= 1 / (RATE / 3), spent.headers
        assert _list(doomed, _caller(doomed)).status_code == 200  # it serves its share
        os.kill(doomed.proc.pid, signal.SIGKILL)
        died = time.monotonic()
        # Its lease ran out (at most LEASE_S after its last renewal) and a counted again.
        while _retry_after(spent := _list(a, key)) > 1 / (RATE / 2):
            assert time.monotonic() - died < LEASE_S + 3 * RATE_SHARE_EVERY_S, spent.headers
            time.sleep(0.1)
        grown = time.monotonic() - died
        assert grown <= LEASE_S + 3 * RATE_SHARE_EVERY_S, grown
        _wait_for_share(b, 2)  # b counts on its own, as quickly
    fresh = _caller(a)
    on_a = [_list(a, fresh).status_code for _ in range(BURST // 2 + 1)]
    assert on_a == [200] * (BURST // 2) + [429], on_a  # a's share of two again: 3
    assert [_list(b, fresh).status_code for _ in range(BURST // 2)] == [200] * (BURST // 2)


def test_a_share_rounds_down_but_never_below_one_token() -> None:
    """The rounding of docs/SCALING.md's tolerance, on the limiter itself."""
    odd = RateLimiter(RATE, 3)
    odd.share(2)  # 1.5 tokens a node: one call at once
    odd.take("k")
    with pytest.raises(RateLimited) as limited:
        odd.take("k")
    assert 1 / (RATE / 2) * 0.5 - 1 <= limited.value.retry_after_s <= 1 / (RATE / 2) * 0.5 + 1
    tiny = RateLimiter(RATE, 1)
    tiny.share(3)  # a burst smaller than N: still one token a node, never none
    tiny.take("k")
    with pytest.raises(RateLimited):
        tiny.take("k")


def test_a_bucket_keeps_how_full_it_is_when_the_share_changes() -> None:
    limiter = RateLimiter(RATE, 8)
    limiter.share(2)  # 4 tokens
    limiter.take("half")
    limiter.take("half")  # half of its share spent
    limiter.share(1)  # 8 tokens: half of them left, 4
    for _ in range(4):
        limiter.take("half")
    with pytest.raises(RateLimited):
        limiter.take("half")
    limiter.share(0)  # no live node counted (this one's lease lost): its own share, all
    assert limiter.nodes == 1
