"""The erasure audit's search: every file the project writes, opened the way its reader opens it.

A byte search over a directory tree finds nothing inside compressed data, and most of what the
stack writes is compressed: Kafka record batches (lz4), Parquet pages (Delta data files and
checkpoints), Spark's state and checkpoint files (lz4-java blocks), Redis RDB files and the RDB
base of the AOF (LZF strings). :func:`scan` therefore searches every file's raw bytes and, where
a file holds containers of those formats, their decoded contents as well:

=====================  ==========================================================================
``kafka``              ``<20 digits>.log`` segments: each v2 record batch, decompressed (none,
                       gzip, lz4, zstd; snappy batches are counted as ``undecoded``)
``parquet``            ``*.parquet``: every value of every column (pyarrow)
``lz4-java``           every ``LZ4Block`` stream block in any file (Spark's lz4 codec)
``rdb``                ``*.rdb``: every LZF-compressed string (the 0xC3 encoding)
``zip``                ``*.zip`` (RocksDB checkpoints): every member, searched like a file
=====================  ==========================================================================

RocksDB's own ``.sst`` files are searched as raw bytes; their lz4-compressed blocks are not
decoded (counted in ``opaque_files``). Their content is the analytics' state, which is derived
from the log alone, and the log is searched decoded.

Two kinds of finding, per store (the first directory level under the root, e.g. ``kafka``,
``lake``, ``redis``): ``plaintext`` (a needle: the canary strings, the user's handle) and
``sealed`` (a value sealed with the erased user's key, ``sealed:v1:<user id>:...``, of which
``readable`` counts those that still open with the key store). After a complete erasure both
``plaintext`` and ``readable`` are 0 everywhere, while ``sealed`` is not: the data is still
there, unreadable.
"""

from __future__ import annotations

import functools
import gzip
import io
import re
import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lz4.block
import lz4.frame
import zstandard

from infra.cli import command_name, run_main

SEGMENT = re.compile(r"^\d{20}\.log$")
LZ4_JAVA_MAGIC = b"LZ4Block"


@dataclass
class StoreFindings:
    files: int = 0
    bytes: int = 0
    decoded_containers: int = 0  # batches, blocks, strings, members decoded and searched
    undecoded: int = 0  # containers seen but not decodable (an unsupported codec)
    opaque_files: int = 0  # files searched as raw bytes only (RocksDB .sst)
    plaintext: int = 0  # (file, needle) pairs: a needle found in a file, raw or decoded
    control_plaintext: int = 0  # (file, needle) pairs of the control needles (the same pass)
    sealed: int = 0  # (file, value) pairs: a distinct value sealed with the user's key in a file
    readable: int = 0  # ... of which still open with the key store
    where: list[str] = field(default_factory=list)  # the first few files with plaintext or readable

    def as_dict(self) -> dict:
        return {**self.__dict__}


# --- decoders ---------------------------------------------------------------------------------------


def kafka_batches(data: bytes) -> Iterator[bytes | None]:
    """The records section of every v2 batch of a segment, decompressed (None: unsupported codec).

    The batch layout is Kafka's (KIP-98): base offset, length, leader epoch, magic (2), CRC,
    attributes (codec in the low 3 bits), ..., record count: 61 bytes, then the records."""
    pos = 0
    while pos + 61 <= len(data):
        _base, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if length <= 0 or end > len(data):
            return
        if data[pos + 16] == 2:  # magic v2
            codec = struct.unpack_from(">h", data, pos + 21)[0] & 0x7
            payload = data[pos + 61 : end]
            try:
                if codec == 0:
                    yield payload
                elif codec == 1:
                    yield gzip.decompress(payload)
                elif codec == 3:
                    yield lz4.frame.decompress(payload)
                elif codec == 4:
                    yield zstandard.ZstdDecompressor().decompressobj().decompress(payload)
                else:
                    yield None
            except (OSError, RuntimeError, EOFError, zstandard.ZstdError):  # a torn batch at a segment's end
                yield None
        pos = end


def lz4_java_blocks(data: bytes) -> Iterator[bytes]:
    """Every block of lz4-java's ``LZ4BlockOutputStream`` (Spark's ``lz4`` codec) in ``data``."""
    pos = data.find(LZ4_JAVA_MAGIC)
    while pos >= 0 and pos + 21 <= len(data):
        token = data[pos + 8]
        clen, dlen = struct.unpack_from("<ii", data, pos + 9)
        body = data[pos + 21 : pos + 21 + clen]
        if 0 <= clen == len(body) and dlen >= 0:
            method = token & 0xF0
            try:
                if method == 0x10:  # stored
                    yield body
                elif method == 0x20 and dlen:
                    yield lz4.block.decompress(body, uncompressed_size=dlen)
            except lz4.block.LZ4BlockError:
                pass
        pos = data.find(LZ4_JAVA_MAGIC, pos + 8)


def lzf_decompress(data: bytes, out_len: int) -> bytes:
    """LZF (liblzf), as Redis compresses strings in RDB files."""
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        ctrl = data[i]
        i += 1
        if ctrl < 32:  # a literal run
            run = ctrl + 1
            if i + run > n:
                raise ValueError("literal past the end")
            out += data[i : i + run]
            i += run
        else:  # a back reference
            length = ctrl >> 5
            if length == 7:
                length += data[i]
                i += 1
            ref = len(out) - ((ctrl & 0x1F) << 8) - data[i] - 1
            i += 1
            if ref < 0:
                raise ValueError("reference before the start")
            for _ in range(length + 2):
                out.append(out[ref])
                ref += 1
        if len(out) > out_len:
            raise ValueError("longer than announced")
    if len(out) != out_len:
        raise ValueError("shorter than announced")
    return bytes(out)


def _rdb_length(data: bytes, pos: int) -> tuple[int, int]:
    first = data[pos]
    kind = first >> 6
    if kind == 0:
        return first & 0x3F, pos + 1
    if kind == 1:
        return ((first & 0x3F) << 8) | data[pos + 1], pos + 2
    if first == 0x80:
        return struct.unpack_from(">I", data, pos + 1)[0], pos + 5
    if first == 0x81:
        return struct.unpack_from(">Q", data, pos + 1)[0], pos + 9
    raise ValueError("not a length")


def rdb_lzf_strings(data: bytes) -> Iterator[bytes]:
    """Every LZF-compressed string of an RDB file: each 0xC3 byte that starts a valid one."""
    pos = data.find(b"\xc3")
    while pos >= 0:
        try:
            clen, p = _rdb_length(data, pos + 1)
            ulen, p = _rdb_length(data, p)
            if 0 < clen <= len(data) - p and 0 < ulen <= 512 * 2**20:
                yield lzf_decompress(data[p : p + clen], ulen)
        except (ValueError, IndexError, struct.error):
            pass
        pos = data.find(b"\xc3", pos + 1)


def parquet_values(data: bytes) -> bytes:
    """Every value of a Parquet file, as one JSON text."""
    import orjson
    import pyarrow.parquet as pq

    return orjson.dumps(pq.read_table(io.BytesIO(data)).to_pylist(), default=str)


# --- the search ---------------------------------------------------------------------------------------


SealedCheck = Callable[[str], bool]  # does this sealed value still open?


def _search(chunk: bytes, needles: list[bytes], sealed: re.Pattern | None) -> tuple[set[bytes], set[bytes]]:
    """The needles in ``chunk``, and the sealed values of the user."""
    plain = {n for n in needles if n in chunk}
    found = set(sealed.findall(chunk)) if sealed is not None else set()
    return plain, found


def _decoded(name: str, data: bytes, st: StoreFindings) -> Iterable[bytes]:
    if SEGMENT.match(name):
        for batch in kafka_batches(data):
            if batch is None:
                st.undecoded += 1
            else:
                st.decoded_containers += 1
                yield batch
    if name.endswith(".parquet"):
        try:
            yield parquet_values(data)
            st.decoded_containers += 1
        except Exception:  # noqa: BLE001 - a torn or foreign file: counted, searched raw
            st.undecoded += 1
    if name.endswith(".rdb"):
        for s in rdb_lzf_strings(data):
            st.decoded_containers += 1
            yield s
    if LZ4_JAVA_MAGIC in data:
        for block in lz4_java_blocks(data):
            st.decoded_containers += 1
            yield block
    if name.endswith(".sst"):
        st.opaque_files += 1


def scan(
    root: Path,
    needles: Iterable[str],
    user_id: int | Iterable[int] | None = None,
    opens: SealedCheck | None = None,
    progress: bool = False,
    control: Iterable[str] = (),
) -> dict[str, StoreFindings]:
    """Search every file under ``root`` (see the module docstring); findings by store. The
    ``control`` needles (known plaintext: the proof that the search sees some) are counted apart,
    in the same pass over the files."""
    raw_needles = [n.encode("utf-8") for n in needles if n]
    raw_control = [n.encode("utf-8") for n in control if n]
    ids = [user_id] if isinstance(user_id, int) else sorted(set(user_id or ()))
    alternatives = b"|".join(b"%d" % u for u in ids)
    sealed = re.compile(rb"sealed:v1:(?:%s):[A-Za-z0-9_-]{38,}" % alternatives) if ids else None
    files = sorted(p for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink())
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), unit="file", desc="erasure audit: searching")
    out: dict[str, StoreFindings] = {}
    for path in files:
        rel = path.relative_to(root)
        store = rel.parts[0] if len(rel.parts) > 1 else "."
        st = out.setdefault(store, StoreFindings())
        try:
            data = path.read_bytes()
        except OSError:  # vanished meanwhile (a log rolled, a temp file)
            continue
        st.files += 1
        st.bytes += len(data)
        chunks: list[tuple[str, bytes]] = [("", data)]
        if path.suffix == ".zip":
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as z:
                    for member in z.namelist():
                        st.decoded_containers += 1
                        chunks.append((f"!{member}", z.read(member)))
            except zipfile.BadZipFile:
                st.undecoded += 1
        for suffix, chunk in list(chunks):  # the file and its zip members, each decoded once
            for decoded in _decoded(suffix[1:] if suffix else path.name, chunk, st):
                chunks.append((suffix + "~", decoded))
        plain: set[bytes] = set()
        found: set[bytes] = set()
        for _suffix, chunk in chunks:  # raw bytes and decoded views overlap: count distinct values
            p, f = _search(chunk, raw_needles + raw_control, sealed)
            plain |= p
            found |= f
        st.control_plaintext += sum(1 for n in raw_control if n in plain)
        plain.difference_update(raw_control)
        readable = sum(1 for v in found if opens is not None and opens(v.decode("ascii")))
        st.plaintext += len(plain)
        st.sealed += len(found)
        st.readable += readable
        if (plain or readable) and len(st.where) < 10:
            st.where.append(str(rel))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


def totals(findings: dict[str, StoreFindings]) -> dict[str, int]:
    keys = (
        "files",
        "bytes",
        "decoded_containers",
        "undecoded",
        "opaque_files",
        "plaintext",
        "control_plaintext",
        "sealed",
        "readable",
    )
    return {k: sum(getattr(f, k) for f in findings.values()) for k in keys}


# --- the CLI: the audit after each erasure (the erasure_audit DAG) --------------------------------


def audit_erasures(settings, user_ids: list[int] | None = None, progress: bool = True) -> dict:
    """For each erased user (the given ones, else every one erased since the last audit): is the
    data key gone, and does any value sealed with it still open anywhere under the var dir?"""
    import json
    import time

    from contract import keys

    store = keys.KeyStore.for_settings(settings)
    out_dir = Path(settings.reports_dir) / "erasure_audit"
    out_dir.mkdir(parents=True, exist_ok=True)
    ledger_path = out_dir / "audited.json"
    ledger = json.loads(ledger_path.read_text()) if ledger_path.exists() else {}
    erased = store.erased()
    users = sorted(user_ids if user_ids else (u for u in erased if str(u) not in ledger))
    opens = functools.partial(keys.still_opens, store)
    found = scan(Path(settings.var_dir), [], user_id=users, opens=opens, progress=progress) if users else {}
    per_user = {str(u): {"tombstone": u in erased, "key_deleted": store.get(u) is None} for u in users}
    report = {
        "checked_at_ms": int(time.time() * 1000),
        "users": per_user,
        "stores": {k: v.as_dict() for k, v in found.items()},
        **{k: v for k, v in totals(found).items() if k in ("files", "bytes", "sealed", "readable")},
    }
    report["ok"] = all(v["tombstone"] and v["key_deleted"] for v in per_user.values()) and not report.get(
        "readable"
    )
    if report["ok"]:
        ledger.update({u: report["checked_at_ms"] for u in per_user})
        ledger_path.write_text(json.dumps(ledger, indent=1) + "\n")
    (out_dir / "erasures-latest.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from infra.settings import get_settings

    p = argparse.ArgumentParser(
        prog=command_name("pipelines.erasure_audit"),
        description="Audit erasures: each erased user's data key is gone and nothing sealed with it "
        "opens anywhere under the var dir (docs/erasure.md). Default: the users erased since the "
        "last clean audit. Exit 1 when a check fails.",
    )
    p.add_argument("--user-id", type=int, action="append", help="audit this user (repeatable)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    report = audit_erasures(get_settings(), a.user_id, progress=not a.no_progress)
    print(json.dumps({k: v for k, v in report.items() if k != "stores"}, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    import sys

    sys.exit(run_main(main, "pipelines.erasure_audit"))
