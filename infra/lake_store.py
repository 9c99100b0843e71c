"""Where the Delta lake lives: a local folder (the default, ``var/lake``) or a prefix on an
S3-compatible object store (``SOCIAL_LAKE_URI=s3a://<bucket>/<prefix>``).

Three clients reach the lake, each configured here from the one group of settings
(``SOCIAL_LAKE_*``, docs/running.md "Your own object store"):

- Spark's Delta (every write, and the jobs' reads) through Hadoop's S3A file system:
  :func:`spark_conf` (the jars: the ``s3`` manifest, infra/jars.py);
- delta-rs (the Delta log's versions and commit metadata, pipelines/lake.py):
  :func:`delta_storage_options`;
- obstore, the same Rust object_store crate as delta-rs (the lake's few plain files: the live
  namespace pointer ``ACTIVE``, the switch history ``namespaces.json``; listing and removing a
  namespace): :class:`ObjectPath`, and the start check :func:`check_lake`.

A local lake is a :class:`pathlib.Path` as before; an object-store lake is an :class:`ObjectPath`,
which answers the few pathlib calls the project makes of its lake root (``/``, ``exists``,
``iterdir``, ``read_text``, ``write_text``, ``stat``) and nothing else, and has no ``__fspath__``:
``Path(<an s3a URI>)`` would fold ``s3a://`` into ``s3a:/`` silently, so it fails loudly instead.

Several writers on one store (the archiver and its compaction in one driver; the maintenance,
restore, rebuild jobs in others): :func:`spark_conf` names the project's LogStore
(``infra/jvm/logstore/``), which writes every commit file with S3's put-if-absent
(``If-None-Match: *``, through S3A's conditional create): of two writers racing for one table
version the store accepts one and refuses the other, and Delta retries the refused one at the next
version, as on HDFS. docs/running.md says what that guarantees and what not.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # obstore's typed dicts exist only in its stubs
    from obstore import ObjectMeta
    from obstore.store import ClientConfig, RetryConfig, S3Config

# infra.settings makes an ObjectPath of an s3a lake (Settings.lake_dir), so this module does not
# import it back: a settings object here is anything with the SOCIAL_LAKE_* fields
Settings = Any

SCHEME = "s3a://"
# Delta's LogStore for s3a paths: the project's put-if-absent one (infra/jvm/logstore/: why)
S3_LOG_STORE = "social.delta.S3ConditionalPutLogStore"


def is_object_uri(location: str) -> bool:
    return str(location).startswith(SCHEME)


def split_uri(uri: str) -> tuple[str, str]:
    """``s3a://bucket/a/b`` -> (``bucket``, ``a/b``)."""
    rest = str(uri)[len(SCHEME) :]
    bucket, _, key = rest.partition("/")
    return bucket, key.strip("/")


@dataclass(frozen=True)
class Stat:
    st_mtime: float


class ObjectPath:
    """A location under an object-store lake, ``s3a://<bucket>/<key>``."""

    __slots__ = ("bucket", "key", "_settings")

    def __init__(self, uri: str, settings: Settings):
        self.bucket, self.key = split_uri(uri)
        self._settings = settings

    # -- names ------------------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectPath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __truediv__(self, part) -> ObjectPath:
        key = "/".join(p for p in (self.key, str(part).strip("/")) if p)
        return ObjectPath(f"{SCHEME}{self.bucket}/{key}", self._settings)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(f"{SCHEME}{self.bucket}/{self.key.rpartition('/')[0]}", self._settings)

    def with_suffix(self, suffix: str) -> ObjectPath:
        stem = self.name.rsplit(".", 1)[0] if "." in self.name else self.name
        return self.parent / f"{stem}{suffix}"

    # -- the store --------------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        """The settings this location was made with (its store's endpoint and credentials)."""
        return self._settings

    def _store(self):
        return object_store(self.settings, self.bucket)

    def _prefix(self) -> str:
        return f"{self.key}/" if self.key else ""

    def _objects(self, limit: int | None = None) -> list[ObjectMeta]:
        import obstore

        found: list[ObjectMeta] = []
        for chunk in obstore.list(self._store(), self._prefix() or None, chunk_size=1000):
            found += chunk
            if limit is not None and len(found) >= limit:
                break
        return found

    def _head(self) -> ObjectMeta | None:
        import obstore
        from obstore.exceptions import NotFoundError

        if not self.key:
            return None
        try:
            return obstore.head(self._store(), self.key)
        except (NotFoundError, FileNotFoundError):
            return None

    def exists(self) -> bool:
        return self._head() is not None or self.is_dir()

    def is_dir(self) -> bool:
        return bool(self._objects(limit=1))

    def iterdir(self):
        import obstore

        listed = obstore.list_with_delimiter(self._store(), self._prefix() or None)
        for prefix in listed["common_prefixes"]:
            yield ObjectPath(f"{SCHEME}{self.bucket}/{prefix.rstrip('/')}", self._settings)
        for meta in listed["objects"]:
            yield ObjectPath(f"{SCHEME}{self.bucket}/{meta['path']}", self._settings)

    def read_text(self) -> str:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            return bytes(obstore.get(self._store(), self.key).bytes()).decode()
        except NotFoundError:
            raise FileNotFoundError(str(self)) from None

    def write_text(self, text: str) -> int:
        """One PUT: readers see the old object or the new one whole, never a part."""
        import obstore

        obstore.put(self._store(), self.key, text.encode())
        return len(text)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: an object store has no folders."""

    def stat(self) -> Stat:
        """The object's last modification; for a prefix, its newest object's."""
        head = self._head()
        metas = [head] if head else self._objects()
        if not metas:
            raise FileNotFoundError(str(self))
        return Stat(max(m["last_modified"].timestamp() for m in metas))

    def remove_tree(self) -> None:
        import obstore

        store = self._store()
        paths = [m["path"] for m in self._objects()]
        for start in range(0, len(paths), 1000):
            obstore.delete(store, paths[start : start + 1000])


def lake_path(location, settings: Settings | None = None) -> Path | ObjectPath:
    """A lake location as the project handles it: an :class:`ObjectPath` for ``s3a://...`` (with
    ``settings``, its store's), else a
    :class:`~pathlib.Path` (an ``ObjectPath`` or ``Path`` given is returned as it is)."""
    if isinstance(location, ObjectPath | Path):
        return location
    if not is_object_uri(location):
        return Path(location)
    if settings is None:
        raise TypeError(f"{location}: an object-store location needs the settings of its store")
    return ObjectPath(location, settings)


def write_atomically(path: Path | ObjectPath, text: str) -> None:
    """Replace the file at ``path`` whole: a rename over it on a local disk, one PUT on a store."""
    if isinstance(path, ObjectPath):
        path.write_text(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic on POSIX


def remove_tree(path: Path | ObjectPath) -> None:
    """Remove everything under ``path`` (nothing there is fine)."""
    import shutil

    if isinstance(path, ObjectPath):
        path.remove_tree()
    else:
        shutil.rmtree(path, ignore_errors=True)


# Clients ------------------------------------------------------------------------------------------


def _allow_http(settings: Settings) -> bool:
    return settings.lake_s3_endpoint.startswith("http://")


@cache
def _store(
    endpoint: str, region: str, access_key: str, secret: str, path_style: bool, bucket: str, retries: int = 10
):
    from datetime import timedelta

    from obstore.store import S3Store

    options: S3Config = {"region": region, "virtual_hosted_style_request": not path_style}
    if endpoint:
        options["endpoint"] = endpoint
    if access_key:
        options["access_key_id"] = access_key
        options["secret_access_key"] = secret
    client: ClientConfig = {
        "allow_http": endpoint.startswith("http://"),
        "timeout": "30s",
        "connect_timeout": "5s",
    }
    retry: RetryConfig = {
        "max_retries": retries,
        "retry_timeout": timedelta(seconds=10 if retries < 3 else 180),
    }
    return S3Store(bucket, config=options, client_options=client, retry_config=retry)


def object_store(settings: Settings, bucket: str, retries: int = 10):
    """An obstore client of ``bucket`` with the lake's settings (one per set of settings)."""
    return _store(
        settings.lake_s3_endpoint,
        settings.lake_s3_region,
        settings.lake_s3_access_key,
        settings.lake_s3_secret_key.get_secret_value(),
        bool(settings.lake_s3_path_style),
        bucket,
        retries,
    )


def delta_storage_options(settings: Settings) -> dict[str, str] | None:
    """delta-rs's ``storage_options`` for the lake (None for a local lake)."""
    if not settings.lake_on_s3:
        return None
    options = {
        "AWS_REGION": settings.lake_s3_region,
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if settings.lake_s3_path_style else "true",
    }
    if settings.lake_s3_endpoint:
        options["AWS_ENDPOINT_URL"] = settings.lake_s3_endpoint
        options["AWS_ALLOW_HTTP"] = "true" if _allow_http(settings) else "false"
    if settings.lake_s3_access_key:
        options["AWS_ACCESS_KEY_ID"] = settings.lake_s3_access_key
        options["AWS_SECRET_ACCESS_KEY"] = settings.lake_s3_secret_key.get_secret_value()
    return options


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Spark confs of a driver whose lake is on an object store (none for a local lake).

    The secret goes into the session's Hadoop configuration, which Spark's UI and event log print
    redacted (``spark.redaction.regex`` matches ``secret`` and ``access.key``).
    """
    if not settings.lake_on_s3:
        return {}
    conf = {
        "spark.hadoop.fs.s3a.endpoint.region": settings.lake_s3_region,
        "spark.hadoop.fs.s3a.path.style.access": "true" if settings.lake_s3_path_style else "false",
        # several writers: every commit file is a put-if-absent (If-None-Match: *); of two writers
        # racing for one version the store refuses one, which Delta then retries at the next
        "spark.delta.logStore.s3a.impl": S3_LOG_STORE,
        "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
        # no retries of a refused conditional PUT, no long waits on a store that is down
        "spark.hadoop.fs.s3a.attempts.maximum": "3",
        "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",
    }
    if settings.lake_s3_endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = settings.lake_s3_endpoint
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false" if _allow_http(settings) else "true"
    if settings.lake_s3_access_key:
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
        conf["spark.hadoop.fs.s3a.access.key"] = settings.lake_s3_access_key
        conf["spark.hadoop.fs.s3a.secret.key"] = settings.lake_s3_secret_key.get_secret_value()
    return conf


# The start check ------------------------------------------------------------------------------------


def lake_where(settings: Settings) -> str:
    endpoint = settings.lake_s3_endpoint or f"AWS S3 ({settings.lake_s3_region})"
    who = f" as {settings.lake_s3_access_key}" if settings.lake_s3_access_key else ""
    return f"lake {settings.lake_uri} at {endpoint}{who}"


def check_lake(settings: Settings) -> tuple[str | None, str]:
    """Probe an object-store lake: the bucket answers, the credentials may list, write, read and
    delete under the prefix, and the store refuses a second ``If-None-Match: *`` PUT of one key
    (what keeps two writers' Delta commits apart). Returns (the problem, None when fit; one line
    of what was found)."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, NotFoundError, PermissionDeniedError

    where = lake_where(settings)
    bucket, prefix = split_uri(settings.lake_uri)
    store = object_store(settings, bucket, retries=1)  # a start check answers in seconds
    probe = "/".join(p for p in (prefix, f"_social_check/{uuid.uuid4().hex}") if p)
    started = time.monotonic()
    try:
        obstore.list(store, prefix or None, chunk_size=1).collect()
        obstore.put(store, probe, b"1", mode="create")
        try:
            try:
                obstore.put(store, probe, b"2", mode="create")
            except AlreadyExistsError:
                pass
            else:
                return (
                    f"{where}: the store does not honour conditional writes (a second PUT with "
                    "If-None-Match: * replaced the object): two writers could replace each other's "
                    "Delta commits",
                    "",
                )
            if bytes(obstore.get(store, probe).bytes()) != b"1":
                return (f"{where}: an object read back differs from the one written", "")
        finally:
            obstore.delete(store, probe)
    except (PermissionDeniedError, NotFoundError, Exception) as exc:  # noqa: BLE001 - one line each
        code = _s3_code(exc)
        if code == "NoSuchBucket":
            return (f"{where}: bucket {bucket} does not exist (create it first)", "")
        refused = re.search(r"status code: 40[13]|AccessDenied|AccessKey|Signature|UserNotFound", str(exc))
        if isinstance(exc, PermissionDeniedError) or refused:
            return (
                f"{where}: credentials refused ({code or 'access denied'}): check SOCIAL_LAKE_S3_ACCESS_KEY "
                "and SOCIAL_LAKE_S3_SECRET_KEY, and that they may list, put, get and delete under the prefix",
                "",
            )
        return (f"{where}: unreachable ({code or _first_line(exc)})", "")
    ms = (time.monotonic() - started) * 1000
    return (
        None,
        f"{where}: bucket {bucket} answers, list/put/get/delete allowed, conditional writes honoured ({ms:.0f} ms)",
    )


def _s3_code(exc: BaseException) -> str | None:
    """The S3 error code in an obstore error (``<Code>NoSuchBucket</Code>``), else its HTTP status,
    else a refused connection, else None."""
    text = str(exc)
    if found := re.search(r"<Code>([^<]+)</Code>", text):
        return found[1]
    if found := re.search(r"status code: (\d{3})", text):
        return found[1]
    if "Connection refused" in text or "error sending request" in text or "connect" in text.lower():
        return "connection refused"
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
