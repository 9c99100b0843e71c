"""The erasure audit's decoders on containers built by hand (pipelines/erasure_audit.py).

Each format is written here as its specification describes it, with the canary inside a
compressed body, so a plain byte search could not find it: the audit must.
"""

from __future__ import annotations

import gzip
import struct
import zipfile

import lz4.block
import lz4.frame
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from pipelines import erasure_audit as ea

CANARY = "canary-5be1d0c3"
HIDDEN = b'{"text": "canary-5be1 and canary-5be1d0c3"}'


def _batch(records: bytes, codec: int) -> bytes:
    """A Kafka v2 record batch (KIP-98 layout): 61 header bytes, then the records section."""
    body = {
        0: records,
        1: gzip.compress(records),
        3: lz4.frame.compress(records),
        4: zstandard.ZstdCompressor().compress(records),
    }[codec]
    header_after_length = struct.pack(
        ">ibIhiqqqhii", 0, 2, 0, codec, 0, 0, 0, -1, -1, -1, 1
    )  # leader epoch, magic 2, crc, attributes, last offset delta, 2 timestamps, producer id/epoch, seq, count
    return struct.pack(">qi", 0, len(header_after_length) + len(body)) + header_after_length + body


def test_lzf_back_references_worked_by_hand():
    # "abc" as a literal run (control 2 = 3 bytes), then 6 bytes copied from 3 back:
    # control (6 - 2) << 5 = 0x80 with the high offset bits 0, then the low offset byte 3 - 1 = 2
    assert ea.lzf_decompress(b"\x02abc\x80\x02", 9) == b"abcabcabc"


def test_kafka_segment_batches_are_decompressed():
    segment = _batch(HIDDEN, 3) + _batch(HIDDEN, 1) + _batch(HIDDEN, 4) + _batch(HIDDEN, 0)
    assert segment.count(CANARY.encode()) == 1  # only the uncompressed batch spells it out
    assert [b == HIDDEN for b in ea.kafka_batches(segment)] == [True] * 4


def test_every_container_kind_is_searched(tmp_path):
    # the canary's second half is a back reference to the first: no compressed body spells it out
    secret = HIDDEN
    # kafka: an lz4 batch in a segment file
    (tmp_path / "kafka" / "t-0").mkdir(parents=True)
    (tmp_path / "kafka" / "t-0" / "00000000000000000000.log").write_bytes(_batch(secret, 3))
    # parquet: a compressed column
    (tmp_path / "lake").mkdir()
    pq.write_table(
        pa.table({"text": [HIDDEN.decode()] * 50}),
        tmp_path / "lake" / "part-0.parquet",
        compression="zstd",
        write_statistics=False,
    )
    # lz4-java block (Spark's lz4 codec): magic, token (lz4 | level), lengths LE, checksum, body
    block = lz4.block.compress(secret, store_size=False)
    lz4java = ea.LZ4_JAVA_MAGIC + bytes([0x20]) + struct.pack("<iii", len(block), len(secret), 0) + block
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "1.changelog").write_bytes(lz4java)
    # RDB: an LZF string (0xC3, compressed length, uncompressed length), the canary as literal runs
    lzf = bytes([len(CANARY) - 1]) + CANARY.encode()
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "dump.rdb").write_bytes(
        b"REDIS0011" + b"\xc3" + bytes([len(lzf), len(CANARY)]) + lzf
    )
    # a zip member (RocksDB checkpoint zips), and a plain log line
    with zipfile.ZipFile(tmp_path / "checkpoints" / "2.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("000001.log", secret)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "api.log").write_text(f"GET /x {CANARY}\n")
    for f in tmp_path.rglob("*"):  # only the log line and the RDB's literal run spell it out raw
        if f.is_file() and f.suffix not in (".log", ".rdb") or f.name.startswith("0000"):
            assert CANARY.encode() not in f.read_bytes(), f

    found = ea.scan(tmp_path, [CANARY])
    assert {s: f.plaintext > 0 for s, f in found.items()} == dict.fromkeys(
        ["kafka", "lake", "checkpoints", "redis", "log"], True
    )
    assert found["kafka"].decoded_containers == 1 and found["redis"].decoded_containers >= 1
    # without the canary nothing is found: the counts come from the data, not from the file kinds
    assert ea.totals(ea.scan(tmp_path, ["absent-0a1b2c"]))["plaintext"] == 0
    # as a control in the same pass it is counted apart (per file: two in checkpoints), not as a finding
    both = ea.scan(tmp_path, ["absent-0a1b2c"], control=[CANARY])
    assert {s: (f.plaintext, f.control_plaintext) for s, f in both.items()} == {
        **dict.fromkeys(["kafka", "lake", "redis", "log"], (0, 1)),
        "checkpoints": (0, 2),
    }


def test_sealed_values_of_the_user_are_counted_and_checked(tmp_path):
    sealed = "sealed:v1:42:" + "A" * 40
    other = "sealed:v1:420:" + "B" * 40
    (tmp_path / "lake").mkdir()
    pq.write_table(pa.table({"handle": [sealed, other]}), tmp_path / "lake" / "users.parquet")
    checked = []
    found = ea.scan(tmp_path, [], user_id=42, opens=lambda v: checked.append(v) or False)
    assert found["lake"].sealed == 1 and found["lake"].readable == 0 and checked == [sealed]
    found = ea.scan(tmp_path, [], user_id=42, opens=lambda v: True)
    assert found["lake"].readable == 1 and found["lake"].where == ["lake/users.parquet"]


def test_the_audit_after_an_erasure_checks_the_key_and_what_still_opens(tmp_path):
    """The erasure_audit DAG's job: a user is clean when the key is gone and nothing sealed with it
    opens; a user the store never erased (key still there) fails the audit."""
    from contract import keys
    from infra.settings import get_settings

    settings = get_settings(var_dir=tmp_path, events_topic="t")
    store = keys.KeyStore.for_settings(settings)
    sealer = keys.Sealer(store)
    erased = sealer.seal({"type": "post_created", "user_id": 5, "text": "gone"})["text"]
    kept = sealer.seal({"type": "post_created", "user_id": 6, "text": "still here"})["text"]
    (tmp_path / "lake").mkdir()
    pq.write_table(pa.table({"text": [erased, kept]}), tmp_path / "lake" / "posts.parquet")
    store.erase(5)

    report = ea.audit_erasures(settings, progress=False)  # default: the users erased since last time
    assert report["ok"] and list(report["users"]) == ["5"] and report["sealed"] == 1
    assert report["readable"] == 0
    assert ea.audit_erasures(settings, progress=False)["users"] == {}  # already audited: nothing new

    report = ea.audit_erasures(settings, [6], progress=False)  # never erased: its key opens its text
    assert not report["ok"] and report["readable"] == 1
    assert report["users"]["6"] == {"tombstone": False, "key_deleted": False}
