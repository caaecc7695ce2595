"""The etcd coordinator's key layout, endpoints and claim order (pure: no etcd client).

Keys, under ``settings.etcd_prefix`` (default ``/scheduler/``)::

    <prefix>members/<node id>        {"incarnation", "host", "pid"}   attached to the node's lease
    <prefix>partitions/<0000-1023>   <node id>                        attached to the node's lease
"""

from __future__ import annotations

import hashlib

from scheduler.errors import ConfigError
from scheduler.partition import PARTITION_COUNT

DEFAULT_PREFIX = "/scheduler/"


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    """``"host:port[,host:port]"`` (an ``http://`` prefix is allowed) → ``[(host, port)]``.

    Raises :class:`ConfigError` naming ``etcd_endpoints`` on bad input.
    """
    out: list[tuple[str, int]] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        item = item.removeprefix("http://").rstrip("/")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"etcd_endpoints: each endpoint must be host:port (got {item!r})")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ConfigError(
            "etcd_endpoints: the etcd coordinator needs at least one host:port "
            "(--etcd-endpoints / SCHEDULER_ETCD_ENDPOINTS)"
        )
    return out


def first_line(exc: BaseException) -> str:
    """``"<ExceptionType>: <first line of its message>"`` (the type alone if it has none)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class KeyLayout:
    """Where the coordinator's keys live under ``prefix`` (``""``: :data:`DEFAULT_PREFIX`).

    Attributes (bytes): ``prefix`` (ends with ``/``), ``members`` and
    ``partitions`` (the two sub-prefixes).
    """

    def __init__(self, prefix: str) -> None:
        prefix = prefix or DEFAULT_PREFIX
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.prefix = prefix.encode()
        self.members = f"{prefix}members/".encode()
        self.partitions = f"{prefix}partitions/".encode()

    def member_key(self, node_id: str) -> bytes:
        """The membership key of ``node_id``."""
        return self.members + node_id.encode()

    def member(self, key: bytes) -> str | None:
        """The node id of a membership key; None for any other key."""
        if not key.startswith(self.members):
            return None
        return key[len(self.members) :].decode(errors="replace")

    def key(self, pid: int) -> bytes:
        """The key of partition ``pid`` (four digits)."""
        return self.partitions + f"{pid:04d}".encode()

    def pid(self, key: bytes) -> int | None:
        """The partition of a partition key; None for any other key."""
        if not key.startswith(self.partitions):
            return None
        try:
            return int(key[len(self.partitions) :])
        except ValueError:
            return None


class ClaimOrder:
    """The order in which ``node_id`` tries free partitions (rendezvous hashing).

    Each member's score of each partition is md5(``member/partition``), cached
    (the cache is emptied past 1,000 members seen).
    """

    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._scores: dict[str, list[bytes]] = {}  # member -> rendezvous score of each partition

    def _score(self, member: str) -> list[bytes]:
        scores = self._scores.get(member)
        if scores is None:
            scores = [hashlib.md5(f"{member}/{pid}".encode()).digest() for pid in range(PARTITION_COUNT)]
            if len(self._scores) > 1000:
                self._scores.clear()
            self._scores[member] = scores
        return scores

    def candidates(self, unavailable: set[int], members: list[str]) -> list[int]:
        """Partitions not in ``unavailable`` in claim order: first those this node
        wins by rendezvous hashing over the live ``members`` (disjoint between
        nodes that agree on the members, so racing claimers rarely collide),
        then the rest, each group in this node's own pseudo-random order."""
        mine = self._score(self._node_id)
        others = [self._score(m) for m in members if m != self._node_id]
        free = [pid for pid in range(PARTITION_COUNT) if pid not in unavailable]
        return sorted(free, key=lambda pid: (any(o[pid] > mine[pid] for o in others), mine[pid]))
