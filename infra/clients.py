"""The one place the project's Kafka and Redis clients are built: every service, job and story asks
here (tests/unit/test_clients.py fails on a client built anywhere else).

Kafka: :func:`kafka_producer`, :func:`kafka_consumer`, :func:`kafka_admin`, each given the settings,
whose bootstrap and security (SASL, TLS: :func:`kafka_security`) every client shares; a Spark Kafka
source or sink gets the same as options (:func:`spark_kafka_options`). Every producer is durable
(``acks=all``, idempotent: a retried batch is never appended twice) and starts from one
configuration (:func:`producer_config`); a :data:`PRODUCER_PROFILES` entry says what a job tunes
(the generator's throughput, the API's short linger, the compacted topics' zstd and Java
partitioner). Consumers read by ``assign()`` and never commit offsets, unless a caller says so.
Nothing here imports a client library until a client is built (the admin helpers and the stack's
CLI stay cheap to import).

Redis: :func:`redis_client`, sync or asyncio, with one timeout policy (:data:`REDIS_TIMEOUTS_S`):
a client's read timeout follows its role, never a number chosen at the call. A URL that names a
node of a Redis Cluster gives a cluster-aware client (:func:`is_cluster` asks the server).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    from infra.settings import Settings

# Where the brokers are and how to reach them: the settings (their bootstrap and security, for
# every client of the project), or a bare bootstrap string (a PLAINTEXT broker: unit tests).
Kafka = Union["Settings", str]

# The generator's batching: big lz4 batches, a deep queue, and no success reports (a Python call
# per event would cost more than producing it).
THROUGHPUT: dict[str, Any] = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "delivery.report.only.error": True,
}

# What each kind of producer changes in :func:`producer_config` (never the durability).
PRODUCER_PROFILES: dict[str, dict[str, Any]] = {
    "durable": {},  # 5 ms linger, lz4: the stories, the fault runs, the writer registry
    "throughput": THROUGHPUT,  # the generator
    "request": {"linger.ms": 2},  # the API: requests batch anyway; answered per record
    "probe": {"linger.ms": 0},  # one record at a time, timed (the scale-out bench)
    # the compacted topics are kept, not streamed (size over CPU), and keyed with Java's
    # partitioner, so a Java or Kafka Streams producer of the same keys picks the same partitions
    "kept": {"compression.type": "zstd", "partitioner": "murmur2_random"},
}
ProducerProfile = Literal["durable", "throughput", "request", "probe", "kept"]

# The read timeout of a Redis client, by what it does. One FCALL over a large group of records can
# keep Redis busy for seconds on a loaded machine, and every other client waits behind it; a job (a
# cut, a verify, a restore, the processor itself) waits for it, where redis-py's default (none) or
# 5 s would fail a caller that only had to wait. A request answers its client within seconds or
# fails; a probe (is the server up?) within one.
REDIS_TIMEOUTS_S: dict[str, float] = {"job": 60.0, "request": 5.0, "probe": 1.0}
RedisRole = Literal["job", "request", "probe"]


def kafka_security(settings: Settings) -> dict[str, str]:
    """The security properties of every confluent-kafka (librdkafka) client, from the settings'
    SOCIAL_KAFKA_SECURITY_PROTOCOL, SASL and TLS group; the password revealed (hand it to a client,
    never to a log)."""
    s = settings
    config = {"security.protocol": s.kafka_security_protocol}
    if s.kafka_sasl:
        config["sasl.mechanism"] = s.kafka_sasl_mechanism
        config["sasl.username"] = s.kafka_sasl_username
        config["sasl.password"] = s.kafka_sasl_password.get_secret_value()
    if s.kafka_tls:
        for key, value in (
            ("ssl.ca.location", s.kafka_ssl_ca_location),
            ("ssl.certificate.location", s.kafka_ssl_certificate_location),
            ("ssl.key.location", s.kafka_ssl_key_location),
        ):
            if value:
                config[key] = value
    return config


def kafka_base(kafka: Kafka) -> dict[str, Any]:
    """What every Kafka client of the project shares: where the brokers are, how to reach them."""
    if isinstance(kafka, str):
        return {"bootstrap.servers": kafka}
    return {"bootstrap.servers": kafka.kafka_bootstrap, **kafka_security(kafka)}


_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_kafka_security(settings: Settings) -> dict[str, str]:
    """The same security for the Java Kafka client (Spark's Kafka source and sink, Kafka's tools).

    Java spells it otherwise than librdkafka: the credentials go in one JAAS line
    (``sasl.jaas.config``), and the PEM files in a PEM trust store and key store (Kafka 2.7+,
    KIP-651), the key store given by value (the certificate chain and an unencrypted PKCS#8 key)."""
    s = settings
    config = {"security.protocol": s.kafka_security_protocol}
    if s.kafka_sasl:
        user = _jaas_quoted(s.kafka_sasl_username)
        password = _jaas_quoted(s.kafka_sasl_password.get_secret_value())
        config["sasl.mechanism"] = s.kafka_sasl_mechanism
        config["sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[s.kafka_sasl_mechanism]} required username={user} password={password};"
        )
    if s.kafka_tls:
        if s.kafka_ssl_ca_location:
            config["ssl.truststore.type"] = "PEM"
            config["ssl.truststore.location"] = s.kafka_ssl_ca_location
        if s.kafka_ssl_certificate_location and s.kafka_ssl_key_location:
            config["ssl.keystore.type"] = "PEM"
            config["ssl.keystore.certificate.chain"] = Path(s.kafka_ssl_certificate_location).read_text()
            config["ssl.keystore.key"] = Path(s.kafka_ssl_key_location).read_text()
    return config


def java_security_file(settings: Settings, path: Path) -> Path:
    """The Java client's security properties (:func:`java_kafka_security`, the password too) in a
    properties file only this user reads, for Kafka's command-line tools (``--command-config``):
    on their command line every user's ``ps`` would show them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    props = java_kafka_security(settings)
    path.write_text("".join(f"{k}={_properties_escaped(v)}\n" for k, v in props.items()))
    return path


def _properties_escaped(value: str) -> str:
    """A value as a Java properties file reads it back (backslashes and line ends escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def spark_kafka_options(settings: Settings) -> dict[str, str]:
    """The brokers and their security as options of a Spark Kafka source or sink (``kafka.``-prefixed:
    Spark hands them to its Java consumers and producers)."""
    java = {"bootstrap.servers": settings.kafka_bootstrap, **java_kafka_security(settings)}
    return {f"kafka.{key}": value for key, value in java.items()}


def producer_config(
    kafka: Kafka,
    client_id: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    profile: ProducerProfile = "durable",
) -> dict[str, Any]:
    """The project's producer: durable (acks=all, idempotent), lz4, 5 ms linger; then the
    profile's changes; ``overrides`` (a fault run's guarantee under test, delivery timeouts) win."""
    return {
        **kafka_base(kafka),
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": "lz4",
        "linger.ms": 5,
        "client.id": client_id,
        **PRODUCER_PROFILES[profile],
        **(overrides or {}),
    }


def delivery_timeouts(timeout_ms: int) -> dict[str, int]:
    """A producer that reports every record within ``timeout_ms``, delivered or not."""
    return {
        "message.timeout.ms": timeout_ms,
        # request.timeout.ms must not exceed message.timeout.ms (librdkafka checks it)
        "request.timeout.ms": min(timeout_ms, 30_000),
        "socket.connection.setup.timeout.ms": min(timeout_ms, 30_000),
    }


def kafka_producer(
    kafka: Kafka,
    client_id: str,
    profile: ProducerProfile = "durable",
    *,
    overrides: Mapping[str, Any] | None = None,
    on_delivery: Callable[[Any, Any], None] | None = None,
):
    """A ``confluent_kafka.Producer`` of :func:`producer_config`, reporting to ``on_delivery``."""
    from confluent_kafka import Producer

    config = producer_config(kafka, client_id, overrides, profile=profile)
    if on_delivery is not None:
        config["on_delivery"] = on_delivery
    return Producer(config)


def consumer_config(kafka: Kafka, group_id: str, overrides: Mapping[str, Any] | None = None) -> dict:
    """A reader that assigns its partitions itself: the group id names it, nothing is committed."""
    return {
        **kafka_base(kafka),
        "group.id": group_id,
        "enable.auto.commit": False,
        **(overrides or {}),
    }


def kafka_consumer(kafka: Kafka, group_id: str, overrides: Mapping[str, Any] | None = None):
    """A ``confluent_kafka.Consumer`` of :func:`consumer_config`."""
    from confluent_kafka import Consumer

    return Consumer(consumer_config(kafka, group_id, overrides))


def kafka_admin(kafka: Kafka, overrides: Mapping[str, Any] | None = None):
    """A ``confluent_kafka.admin.AdminClient`` for the brokers of ``kafka``. librdkafka's own log
    lines (one per failed connection) go to the ``infra.kafka_admin`` logger, not to stderr: a
    command that cannot reach Kafka ends with one line of its own (infra/cli.py)."""
    import logging

    from confluent_kafka.admin import AdminClient

    logger = logging.getLogger("infra.kafka_admin")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())  # shown where the process configures logging
    # Any: confluent-kafka types a config's values as scalars, but "logger" (and an override's
    # "error_cb") are objects librdkafka's Python binding takes too
    conf: dict[str, Any] = {**kafka_base(kafka), "logger": logger, **(overrides or {})}
    return AdminClient(conf)


def redis_client(
    url: str,
    role: RedisRole = "job",
    *,
    decode_responses: bool = False,
    asyncio: bool = False,
    cluster: bool | None = None,
    resend: bool = True,
    **kwargs: Any,
):
    """A ``redis.Redis`` (``redis.asyncio.Redis`` with ``asyncio``) for ``url``, its read timeout
    the role's (:data:`REDIS_TIMEOUTS_S`); a ``redis.RedisCluster`` (``redis.asyncio.RedisCluster``)
    when ``url`` names a node of a Redis Cluster: the same setting (SOCIAL_REDIS_URL) names either.

    ``cluster`` None asks the server once per URL and process (:func:`is_cluster`); a probe
    (is this server up?) asks the one server at the URL, never the cluster behind it, unless
    ``cluster`` says otherwise.

    ``resend`` False: a command whose connection fails is not sent again by redis-py (which by
    default reconnects and resends up to 3 times, on a single Redis and on a cluster alike): the
    error reaches the caller. For a writer whose calls are fenced by state in Redis (the
    partitioned processor): a call resent to a master that restarted from an append-only file
    lacking its last second would land on fences that rolled back, past records it never applied
    (docs/architecture.md, "On Redis Cluster"). A cluster's redirections (MOVED, ASK, TRYAGAIN) are
    followed either way: they are no connection's failure."""
    import redis
    import redis.asyncio

    if cluster is None:
        cluster = role != "probe" and is_cluster(url)
    if cluster:
        cls: Any = redis.asyncio.RedisCluster if asyncio else redis.RedisCluster
    else:
        cls = redis.asyncio.Redis if asyncio else redis.Redis
    if not resend:
        from redis.asyncio.retry import Retry as AsyncRetry
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs["retry"] = (AsyncRetry if asyncio else Retry)(NoBackoff(), 0)
    client = cls.from_url(
        url, socket_timeout=REDIS_TIMEOUTS_S[role], decode_responses=decode_responses, **kwargs
    )
    if cluster:
        _route_fcall_by_its_keys(client, asyncio)
    return client


def _fcall_keys(args: tuple) -> list | None:
    """The keys of ``FCALL``/``FCALL_RO <function> <numkeys> <key>...`` (None: another command)."""
    if len(args) >= 3 and str(args[0]).upper() in ("FCALL", "FCALL_RO"):
        return list(args[3 : 3 + int(args[2])])
    return None


def _route_fcall_by_its_keys(client: Any, asyncio: bool) -> None:
    """Route an FCALL by the keys it names (its ``numkeys``), as redis-py already does EVAL's.

    redis-py 8.1 finds the keys of a "movablekeys" command (FCALL is one) by asking a node
    ``COMMAND GETKEYS`` with the whole command, one round trip before each call (two for a call
    in a pipeline), every argument sent twice more: 640 extra round trips for 320 FCALLs of the
    speed layer, measured on a 3-master cluster here (redis/redis-py#2229, #2836). The cluster
    client's commands parser, shared by its pipelines, is given this rule first; every other
    command is parsed as before."""
    sync_parser, async_parser = _parsers()
    # the parser as built (it has read the server's COMMAND table already), given the subclass
    client.commands_parser.__class__ = async_parser if asyncio else sync_parser


@functools.cache
def _parsers() -> tuple[type, type]:
    """redis-py's commands parsers (sync, asyncio) with :func:`_fcall_keys` first (defined when a
    cluster client is first built: importing this module imports no client library)."""
    from redis._parsers.commands import AsyncCommandsParser, CommandsParser

    class FcallKeys(CommandsParser):
        def get_keys(self, redis_conn, *args):
            keys = _fcall_keys(args)
            return keys if keys is not None else super().get_keys(redis_conn, *args)

    class AsyncFcallKeys(AsyncCommandsParser):
        async def get_keys(self, *args):
            keys = _fcall_keys(args)
            return keys if keys is not None else await super().get_keys(*args)

    return FcallKeys, AsyncFcallKeys


_CLUSTER_ENABLED: dict[str, bool] = {}  # URL -> its server runs in cluster mode (asked once)


def is_cluster(url: str) -> bool:
    """Whether the server at ``url`` runs in cluster mode (``INFO cluster``: ``cluster_enabled:1``).

    Asked once per URL in a process; a server that does not answer (not up yet, a wrong password)
    is taken for a single Redis and asked again next time: the client built for it then fails as
    it always did, with the server's own reason."""
    import redis

    if url in _CLUSTER_ENABLED:
        return _CLUSTER_ENABLED[url]
    timeout = REDIS_TIMEOUTS_S["probe"]
    probe = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        enabled = int(probe.info("cluster").get("cluster_enabled", 0)) == 1
    except redis.RedisError:
        return False
    finally:
        probe.close()
    _CLUSTER_ENABLED[url] = enabled
    return enabled
