"""Ids of the social app: snowflake ``post_id``/``message_id``/``user_id`` and UUID ``event_id``.

Shared by the HTTP API and the generator, so ids from both never collide in the log.

Snowflake layout (int64, always positive, time-sortable)::

    0 | 41 bits: ms since EPOCH_MS | 10 bits: worker id | 12 bits: sequence

Unique because every writer of a log (each API process, each generator run, ``--inject`` and
fault runs included) gets a worker id of its own for the life of the log, allocated from the
log's registry in Kafka (``contract.writers``), never a default: two writers never share one, so
their ids differ in the worker bits whatever their clocks say. The generator passes its simulated
clock explicitly, so its ids are reproducible from the seed apart from the worker bits
(``--worker-id`` fixes those too, for a reproducibility check; such a run bypasses the registry).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import numpy as np

EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z; 41 bits of ms last until 2093
WORKER_BITS = 10
SEQUENCE_BITS = 12
MAX_WORKER_ID = (1 << WORKER_BITS) - 1
MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1
_TIME_SHIFT = WORKER_BITS + SEQUENCE_BITS


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Snowflake:
    """Thread-safe snowflake id source for one worker.

    ``next_id(now_ms)`` uses the given time (a simulated clock) or the wall clock. Ids are strictly
    increasing per instance even if the clock steps back (the last timestamp is kept) or more
    than 4096 ids are asked for in one millisecond (the timestamp borrows from the next ms).
    """

    def __init__(self, worker_id: int, clock=wall_clock_ms):
        if not 0 <= worker_id <= MAX_WORKER_ID:
            raise ValueError(f"worker_id must be in 0..{MAX_WORKER_ID}, got {worker_id}")
        self.worker_id = worker_id
        self._clock = clock
        self._lock = threading.Lock()
        self._last_ms = -1
        self._seq = 0

    def next_id(self, now_ms: int | None = None) -> int:
        ms = (self._clock() if now_ms is None else now_ms) - EPOCH_MS
        if ms < 0:
            raise ValueError(f"time {ms + EPOCH_MS} is before the snowflake epoch {EPOCH_MS}")
        with self._lock:
            if ms <= self._last_ms:
                ms = self._last_ms
                self._seq += 1
                if self._seq > MAX_SEQUENCE:
                    ms += 1
                    self._seq = 0
            else:
                self._seq = 0
            self._last_ms = ms
            return (ms << _TIME_SHIFT) | (self.worker_id << SEQUENCE_BITS) | self._seq


def snowflake_time_ms(snowflake_id: int) -> int:
    """The epoch ms encoded in a snowflake id."""
    return (snowflake_id >> _TIME_SHIFT) + EPOCH_MS


def snowflake_worker(snowflake_id: int) -> int:
    return (snowflake_id >> SEQUENCE_BITS) & MAX_WORKER_ID


def snowflake_without_worker(snowflake_id: int) -> int:
    """The id with its worker bits cleared: two generator runs of one seed on different worker ids
    mint ids equal in everything else (the simulated clock and the sequence)."""
    return snowflake_id & ~(MAX_WORKER_ID << SEQUENCE_BITS)


def new_event_id() -> str:
    """A random UUID (v4) string, for events created one at a time (the API)."""
    return str(uuid.UUID(bytes=os.urandom(16), version=4))


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# positions of the 32 hex digits inside the 36-char canonical form (hyphens at 8, 13, 18, 23)
_DIGIT_POS = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])


def event_ids(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` UUID v4 strings drawn from ``rng`` (reproducible from a seed), vectorised."""
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    nibbles = np.empty((n, 32), dtype=np.uint8)
    nibbles[:, 0::2] = raw >> 4
    nibbles[:, 1::2] = raw & 0x0F
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    out[:, _DIGIT_POS] = _HEX[nibbles]
    text = out.tobytes().decode("ascii")
    return [text[i : i + 36] for i in range(0, 36 * n, 36)]
