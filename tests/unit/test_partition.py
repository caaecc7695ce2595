"""Partition assignment (scheduler/partition.py): pinned values, distribution, SQL twin.

The algorithm is a wire format: every client and the SQL expression in the
module docstring must agree forever, so the values are pinned as literals
(computed once from the documented algorithm: SHA-256 over the 16 raw UUID
bytes, first 8 bytes big-endian, mod 1024) and re-derived here independently
with hashlib.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections import Counter

import pytest

from scheduler.partition import PARTITION_COUNT, partition_of, stable_hash

# (uuid, stable_hash, partition_id). SHA-256 of 16 zero bytes starts with
# 374708fff7719dd5 (a well-known digest), hence the first row.
KNOWN = [
    ("00000000-0000-0000-0000-000000000000", 0x374708FFF7719DD5, 469),
    ("ffffffff-ffff-ffff-ffff-ffffffffffff", 0x5AC6A5945F165009, 9),
    ("12345678-1234-5678-1234-567812345678", 0xDDCBC45ED5383449, 73),
    ("6ba7b810-9dad-11d1-80b4-00c04fd430c8", 0x4EBC3BF944587D83, 387),
    ("550e8400-e29b-41d4-a716-446655440000", 0xCEE82307E6AD54D9, 217),
]


def reference_hash(job_id: uuid.UUID) -> int:
    """The documented algorithm, written independently of the module."""
    return int(hashlib.sha256(job_id.bytes).hexdigest()[:16], 16)


@pytest.mark.parametrize(("text", "expected_hash", "expected_partition"), KNOWN)
def test_known_values_are_pinned(text: str, expected_hash: int, expected_partition: int) -> None:
    job_id = uuid.UUID(text)
    assert stable_hash(job_id) == expected_hash
    assert partition_of(job_id) == expected_partition
    assert expected_hash % 1024 == expected_partition


def test_matches_reference_algorithm_on_many_ids() -> None:
    rng = random.Random(20240101)
    for _ in range(2_000):
        job_id = uuid.UUID(int=rng.getrandbits(128))
        expected = reference_hash(job_id)
        assert stable_hash(job_id) == expected
        assert partition_of(job_id) == expected % PARTITION_COUNT


def test_hash_is_unsigned_64_bit() -> None:
    assert PARTITION_COUNT == 1024
    rng = random.Random(7)
    values = [stable_hash(uuid.UUID(int=rng.getrandbits(128))) for _ in range(1_000)]
    assert all(0 <= v < 2**64 for v in values)
    # The top bit is set for about half of them: read as unsigned, not signed.
    assert 400 < sum(v >= 2**63 for v in values) < 600


def test_distribution_over_100k_uuid4() -> None:
    counts = Counter(partition_of(uuid.uuid4()) for _ in range(100_000))
    assert set(counts) == set(range(PARTITION_COUNT))
    # Mean ~97.7 per partition, sd ~9.9: 40..160 is > 5 sd either side.
    assert min(counts.values()) >= 40
    assert max(counts.values()) <= 160
