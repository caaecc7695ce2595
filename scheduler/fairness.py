"""Tenant fairness within a tick's budget (docs/design.md §5): pure, no I/O.

The allocator is a *weighted deficit round robin* (Shreedhar & Varghese,
1995) over the tenants with due work, one round per tick:

* every tick, each tenant ``t`` is credited ``budget × w_t / Σw`` tokens
  (its weighted share of the node's per-tick budget) on top of the fraction
  it carried from earlier ticks; its **quota** is the whole part;
* a tenant that uses less than its quota had no more due work: its carry is
  reset to zero (the DRR rule for an emptied queue), so idle tenants do not
  hoard credit;
* budget left over because some tenants had little due work is handed, in a
  second pass of the same tick, to the tenants that used all their quota, in
  proportion to their weights (:meth:`DeficitRoundRobin.redistribute`): the
  node stays work-conserving, so a lone big tenant still gets the whole
  budget.

Properties (tested with hypothesis in tests/unit/test_fairness.py): a
tick's quotas exceed the budget by fewer runs than there are tenants, and
over many ticks the total is the budget per tick within that bound; a
saturated tenant is served at least every ⌈Σw / (budget × w_t)⌉ ticks — every
tick when its share is at least one run, as with the default budget of
100,000 runs; each tenant's service is proportional to its weight within one
run.

Rate caps: a tenant's cap (runs/s, fleet-wide, stored in ``tenants.max_rate``)
is enforced per node as ``cap × owned partitions / 1024`` runs/s — its share,
since jobs hash uniformly over partitions — with a token bucket of one tick's
worth (:class:`TokenBucket`).
"""

from __future__ import annotations

import dataclasses
import math

from scheduler.partition import PARTITION_COUNT


@dataclasses.dataclass
class TokenBucket:
    """Tokens refilled at ``rate_per_s`` up to ``burst``; time in seconds."""

    rate_per_s: float
    burst: float
    tokens: float
    updated_s: float

    def refill(self, now_s: float) -> float:
        """Add the tokens earned since the last refill; return the balance."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now_s - self.updated_s) * self.rate_per_s)
        self.updated_s = now_s
        return self.tokens


def node_share_of_cap(max_rate_per_s: float, partitions_owned: int) -> float:
    """A fleet-wide cap's share for a node owning ``partitions_owned`` partitions."""
    return max_rate_per_s * (partitions_owned / PARTITION_COUNT)  # never above the cap (no overflow)


class DeficitRoundRobin:
    """Per-tick quotas for tenants; state carries between ticks (see module doc)."""

    def __init__(self) -> None:
        self._carry: dict[str, float] = {}

    def quotas(self, budget: int, weights: dict[str, int], limits: dict[str, int] | None = None) -> dict[str, int]:
        """Quotas for one tick: ``{tenant: runs}``.

        Their sum is below ``budget + len(weights)``: each tenant's quota is
        the whole part of its credit, whose fractional part carries over, so a
        tick may exceed the budget by fewer runs than there are tenants while
        the long-run rate is exactly ``budget`` per tick (no trimming, which
        would starve low-weight tenants when the budget is small).

        ``weights``: tenants to serve (≥ 1 each). ``limits``: optional
        per-tenant upper bounds this tick (rate caps). Tenants absent from
        ``weights`` lose their carry.
        """
        if budget <= 0 or not weights:
            return {}
        total = sum(weights.values())
        for tenant in list(self._carry):
            if tenant not in weights:
                del self._carry[tenant]
        result: dict[str, int] = {}
        for tenant, weight in weights.items():
            credit = self._carry.get(tenant, 0.0) + budget * weight / total
            quota = int(math.floor(credit + 1e-9))
            if limits is not None and tenant in limits:
                quota = min(quota, max(0, limits[tenant]))
            self._carry[tenant] = credit
            result[tenant] = quota
        return result

    def charge(self, used: dict[str, int], quotas: dict[str, int]) -> None:
        """Record what each tenant used of its quota this tick.

        A tenant that used less than its quota ran out of due work: its carry
        resets to 0. Otherwise the used tokens are deducted.
        """
        for tenant, quota in quotas.items():
            spent = used.get(tenant, 0)
            if spent < quota:
                self._carry[tenant] = 0.0
            else:
                self._carry[tenant] = max(0.0, self._carry.get(tenant, 0.0) - spent)

    @staticmethod
    def redistribute(leftover: int, weights: dict[str, int], limits: dict[str, int] | None = None) -> dict[str, int]:
        """Split ``leftover`` budget among ``weights``' tenants by weight (largest remainder).

        Used within a tick for tenants that exhausted their quota; no carry.
        """
        if leftover <= 0 or not weights:
            return {}
        total = sum(weights.values())
        exact = {t: leftover * w / total for t, w in weights.items()}
        result = {t: int(v) for t, v in exact.items()}
        rest = leftover - sum(result.values())
        for tenant in sorted(exact, key=lambda t: exact[t] - result[t], reverse=True)[:rest]:
            result[tenant] += 1
        if limits is not None:
            result = {t: min(q, max(0, limits.get(t, q))) for t, q in result.items()}
        return {t: q for t, q in result.items() if q > 0}
