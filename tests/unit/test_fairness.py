"""Properties of the fairness allocator (scheduler/fairness.py)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.fairness import DeficitRoundRobin, TokenBucket, node_share_of_cap
from scheduler.firing.outcomes import RateCaps

tenant_weights = st.dictionaries(
    st.text("abcdefghij", min_size=1, max_size=4), st.integers(1, 20), min_size=1, max_size=30
)


def test_lone_tenant_gets_the_whole_budget() -> None:
    drr = DeficitRoundRobin()
    assert drr.quotas(50_000, {"big": 1}) == {"big": 50_000}


def test_herd_shape_small_tenants_get_their_share_first() -> None:
    """One tenant with 250,000 due, 50 with 50 each: every small tenant is served in tick 1."""
    drr = DeficitRoundRobin()
    weights = {"big": 1, **{f"small{i}": 1 for i in range(50)}}
    quotas = drr.quotas(50_000, weights)
    assert quotas["big"] == quotas["small0"] == 980  # 50,000 // 51
    used = {"big": 980, **{f"small{i}": 50 for i in range(50)}}
    extra = DeficitRoundRobin.redistribute(50_000 - sum(used.values()), {"big": 1})
    assert extra == {"big": 50_000 - 980 - 50 * 50}
    drr.charge(used, quotas)
    # Small tenants drained: their carry is reset, not hoarded.
    assert drr.quotas(50_000, weights)["small0"] == 980


@settings(max_examples=200, deadline=None)
@given(tenant_weights, st.integers(1, 100_000))
def test_quotas_stay_within_budget(weights: dict[str, int], budget: int) -> None:
    """Each tick exceeds the budget by fewer runs than tenants; over time it is exact."""
    drr = DeficitRoundRobin()
    total = 0
    for tick in range(1, 21):
        quotas = drr.quotas(budget, weights)
        assert sum(quotas.values()) < budget + len(weights)
        assert all(q >= 0 for q in quotas.values())
        drr.charge(quotas, quotas)
        total += sum(quotas.values())
        assert tick * budget - len(weights) < total <= tick * budget


@settings(max_examples=200, deadline=None)
@given(tenant_weights, st.integers(1, 200))
def test_no_tenant_waits_longer_than_its_round(weights: dict[str, int], budget: int) -> None:
    """A saturated tenant is served at least every ceil(total weight / (budget × w)) ticks.

    When its share is at least one run (the default budget is 100,000 runs
    per tick) that is every tick: no tenant with due work waits a round.
    """
    drr = DeficitRoundRobin()
    total = sum(weights.values())
    last_served = {t: 0 for t in weights}
    for tick in range(1, 60):
        quotas = drr.quotas(budget, weights)
        drr.charge(quotas, quotas)  # every tenant saturated: uses all it gets
        for tenant, quota in quotas.items():
            if quota > 0:
                bound = math.ceil(total / (budget * weights[tenant]))
                assert tick - last_served[tenant] <= bound, (tenant, tick, last_served[tenant], bound)
                last_served[tenant] = tick


@settings(max_examples=100, deadline=None)
@given(tenant_weights, st.integers(50, 5_000))
def test_service_is_proportional_to_weight(weights: dict[str, int], budget: int) -> None:
    drr = DeficitRoundRobin()
    served = {t: 0 for t in weights}
    ticks = 40
    for _ in range(ticks):
        quotas = drr.quotas(budget, weights)
        drr.charge(quotas, quotas)
        for tenant, quota in quotas.items():
            served[tenant] += quota
    total = sum(weights.values())
    for tenant, weight in weights.items():
        ideal = ticks * budget * weight / total
        assert ideal - 1 < served[tenant] <= ideal


@given(st.integers(1, 10_000), st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 9), min_size=1))
def test_redistribute_splits_exactly(leftover: int, weights: dict[str, int]) -> None:
    extra = DeficitRoundRobin.redistribute(leftover, weights)
    assert sum(extra.values()) == leftover
    total = sum(weights.values())
    for tenant, quota in extra.items():
        assert abs(quota - leftover * weights[tenant] / total) < 1


def test_limits_cap_quotas() -> None:
    drr = DeficitRoundRobin()
    quotas = drr.quotas(1_000, {"a": 1, "b": 1}, limits={"a": 10})
    assert quotas == {"a": 10, "b": 500}


def test_token_bucket_and_node_share() -> None:
    assert node_share_of_cap(1_000, 256) == 250.0  # a quarter of the partitions
    bucket = TokenBucket(rate_per_s=100, burst=100, tokens=0, updated_s=0.0)
    assert bucket.refill(0.5) == 50
    assert bucket.refill(10.0) == 100  # capped at burst


def test_a_huge_stored_cap_gives_a_finite_limit_not_a_crash() -> None:
    """A cap of 1e308 runs/s (stored before the bound existed, or written by hand) made the
    node's share overflow to infinity and ``int(inf)`` crashed every tick of every node, for
    every tenant. A cap that large limits nothing: the tick's limit saturates."""
    caps = RateCaps()
    tenants = {"big": {"max_rate": 1e308}, "small": {"max_rate": 2.0}}
    assert node_share_of_cap(1e308, 1024) == 1e308
    limits = caps.limits(tenants, owned=1024, now_s=100.0, tick_interval_s=1.0)
    assert limits == {"big": RateCaps.MAX_LIMIT, "small": 2}
    assert caps.limits(tenants, owned=1024, now_s=101.0, tick_interval_s=1.0) == {"big": RateCaps.MAX_LIMIT, "small": 2}


def test_the_cli_bound_of_a_rate_cap_is_the_store_side_bound() -> None:
    from scheduler.cli import MAX_RATE
    from scheduler.jobs import MAX_TENANT_RATE

    assert MAX_RATE.high == MAX_TENANT_RATE
