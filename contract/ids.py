"""Ids of the social app: snowflake ``post_id``/``message_id``/``user_id``, and ``event_id``:
sequenced (``sq:<writer>:<seq>``) for the writers of this project, a UUID for keyed API requests.

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


# A sequenced event id: the writer's worker id (the registry's, contract/writers.py) and the
# writer's own count of its events, from 1. Its dedup memory is per writer, not per id
# (docs/views.md, "Duplicates"): R bytes per writer and partition. The canonical form only, ASCII
# digits without leading zeros, at most 15 each (exact in a Lua number): the Redis library
# (contract/redis_functions/dedup.lua), the batch layer and the specification read it alike;
# anything else is an opaque id.
SEQUENCED = r"^sq:(0|[1-9][0-9]{0,14}):([1-9][0-9]{0,14})$"
MAX_SEQ = 10**15 - 1


def sequenced_id(writer: int, seq: int) -> str:
    if not 0 <= writer <= MAX_SEQ or not 1 <= seq <= MAX_SEQ:
        raise ValueError(
            f"a sequenced event id needs writer 0..{MAX_SEQ} and seq 1..{MAX_SEQ}: {writer}, {seq}"
        )
    return f"sq:{writer}:{seq}"


class EventIds:
    """Thread-safe sequenced event ids of one writer: ``sq:<worker id>:1``, ``:2``, ...

    A writer numbers its events from 1 for the life of its worker id (a restarted writer claims a
    new one, so it never repeats a seq). ``start`` resumes a count (the generator's chunks)."""

    def __init__(self, writer: int, start: int = 1):
        self.writer = writer
        self._lock = threading.Lock()
        self._next = start

    def next_id(self) -> str:
        with self._lock:
            seq, self._next = self._next, self._next + 1
        return sequenced_id(self.writer, seq)

    def take(self, n: int) -> list[str]:
        """``n`` consecutive ids."""
        with self._lock:
            first, self._next = self._next, self._next + n
        if first + n - 1 > MAX_SEQ:
            raise ValueError(f"writer {self.writer} has used every seq")
        prefix = f"sq:{self.writer}:"
        return [prefix + str(s) for s in range(first, first + n)]


def new_event_id() -> str:
    """A random UUID (v4) string, for events created one at a time (the API)."""
    return str(uuid.UUID(bytes=os.urandom(16), version=4))
