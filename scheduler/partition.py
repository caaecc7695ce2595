"""Partition assignment: ``partition_id = stable_hash(job_id) mod 1024``.

The hash is language-independent and documented so any client (or a SQL
expression) can compute it:

    stable_hash(job_id) = the first 8 bytes of SHA-256 over the 16 raw bytes
                          of the UUID (RFC 4122 byte order), read as an
                          unsigned big-endian 64-bit integer.
    partition_id        = stable_hash(job_id) mod 1024

Since 1024 is a power of two, ``partition_id`` is the low 10 bits of bytes
6..7 of the digest. The same value in SQL (PostgreSQL 11+ and CockroachDB):

    get_byte(sha256(uuid_send(job_id)), 6) % 4 * 256
      + get_byte(sha256(uuid_send(job_id)), 7)

Python's ``hash()`` is salted per process and must never be used here.
Known values are pinned by ``tests/unit/test_partition.py``.
"""

from __future__ import annotations

import hashlib
import uuid

PARTITION_COUNT = 1024
"""Logical partitions (docs/design.md §2). Changing it re-homes every job: don't."""


def stable_hash(job_id: uuid.UUID) -> int:
    """Return the unsigned 64-bit stable hash of ``job_id`` (see module doc)."""
    return int.from_bytes(hashlib.sha256(job_id.bytes).digest()[:8], "big")


def partition_of(job_id: uuid.UUID) -> int:
    """Return the partition (0..1023) that owns ``job_id``."""
    digest = hashlib.sha256(job_id.bytes).digest()
    return ((digest[6] << 8) | digest[7]) % PARTITION_COUNT
