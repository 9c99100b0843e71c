"""Checks of the components the project uses but did not start: an existing Kafka
(``SOCIAL_KAFKA_EXTERNAL=1``), an existing Redis (``SOCIAL_REDIS_EXTERNAL=1``) and the object
store of a lake on S3 (``SOCIAL_LAKE_URI=s3a://...``).

``make up`` (:meth:`infra.stack.Stack.up`) runs them before it starts any process of its own, and
starts none when one fails: each problem is one line naming the component (its address, the
password masked) and what the design needs of it (docs/running.md, "Your own Kafka" and "Your own
Redis"). ``social check-external`` (``python -m infra.external``) runs them alone.

- Redis: answers with the URL's credentials, version >= 7.0 (the Redis functions),
  ``maxmemory-policy noeviction`` (an evicted key is serving state lost without a trace) and an
  append-only file (the archiver archives a cut of Redis only once its AOF has it:
  SOCIAL_ARCHIVE_DURABILITY_S).
- Kafka: answers with the security settings (infra/clients.py), the event topic exists (or this
  user may create it) with the contract's partitions, kept forever (``retention.ms`` and
  ``retention.bytes`` -1, ``cleanup.policy=delete``), and this user may read, write and describe
  it; the writer registry topic exists or is created; the speed layer's compacted topics
  (``SOCIAL_COMPACTED_TOPICS``) may be created under the event topic's name.

The facts are read with the project's clients; the verdicts are plain functions of them
(:func:`redis_problems`, :func:`topic_problems`), unit-tested on their own.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Collection, Mapping

from infra import clients
from infra.cli import command_name, run_main
from infra.kafka_admin import events_topic_configs, writers_topic, writers_topic_configs
from infra.processes import StackError
from infra.services import REDIS_MIN_VERSION
from infra.settings import Settings, get_settings, redact_url

# what the project does with the event topic and the registry: append (idempotent producers need
# only Write since Kafka 3.0, KIP-679), read, and look up partitions and offsets
TOPIC_OPERATIONS = ("READ", "WRITE", "DESCRIBE")
KEPT_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}

_quiet = logging.getLogger("infra.external.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


class ExternalUnfit(StackError):
    """An external component is unreachable or unfit: one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


# Redis -----------------------------------------------------------------------------------------


def redis_where(settings: Settings) -> str:
    return f"redis at {redact_url(settings.redis_url)}"


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def redis_problems(where: str, info: Mapping[str, object]) -> list[str]:
    """What keeps a Redis (its ``INFO``: ``redis_version``, ``maxmemory_policy``, ``aof_enabled``)
    from serving the project, one line each."""
    problems = []
    version = str(info.get("redis_version", "?"))
    if _version(version) < REDIS_MIN_VERSION:
        need = ".".join(map(str, REDIS_MIN_VERSION))
        problems.append(
            f"{where}: version {version}, the serving store needs {need} or later (Redis functions)"
        )
    policy = str(info.get("maxmemory_policy", "?"))
    if policy != "noeviction":
        problems.append(
            f"{where}: maxmemory-policy is {policy}, needs noeviction "
            "(an evicted key is serving state lost without a trace)"
        )
    if str(info.get("aof_enabled", "0")) != "1":
        problems.append(
            f"{where}: appendonly is no, needs yes "
            "(the archiver archives only what Redis's append-only file holds)"
        )
    return problems


def check_redis(settings: Settings) -> str:
    """Check the Redis at SOCIAL_REDIS_URL; returns one line of what it found, or raises
    :class:`ExternalUnfit`."""
    import redis

    where = redis_where(settings)
    client = clients.redis_client(settings.redis_url, "probe", decode_responses=True)
    try:
        client.ping()
        info = {**client.info("server"), **client.info("memory"), **client.info("persistence")}
        info.update(client.info("cluster"))
    except redis.AuthenticationError as exc:
        raise ExternalUnfit(
            [f"{where}: authentication failed ({exc}): check the password in SOCIAL_REDIS_URL"]
        ) from None
    except redis.ResponseError as exc:
        if "NOAUTH" in str(exc) or "NOPERM" in str(exc):
            raise ExternalUnfit(
                [f"{where}: authentication failed ({exc}): check the password in SOCIAL_REDIS_URL"]
            ) from None
        raise ExternalUnfit([f"{where}: refused INFO ({exc})"]) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ExternalUnfit([f"{where}: unreachable ({exc})"]) from None
    finally:
        client.close()
    problems = redis_problems(where, info)
    masters = 1
    if int(info.get("cluster_enabled", 0)) == 1:  # a Redis Cluster: every master serves partitions
        masters, more = _cluster_problems(settings, where)
        problems += more
    if problems:
        raise ExternalUnfit(problems)
    what = f"a Redis Cluster of {masters} masters, each" if masters > 1 else "Redis"
    return f"{where}: {what} {info['redis_version']}, maxmemory-policy noeviction, appendonly yes"


def _cluster_problems(settings: Settings, where: str) -> tuple[int, list[str]]:
    """The masters of the cluster ``where`` names, and what keeps each from serving (the same
    facts as one Redis, each line naming the master), and the keyed layout, which cannot run on one."""
    import redis

    problems = []
    if settings.serving_layout != "partitioned":
        problems.append(
            f"{where}: a Redis Cluster, where SOCIAL_SERVING_LAYOUT={settings.serving_layout} cannot run "
            "(its calls span slots): set SOCIAL_SERVING_LAYOUT=partitioned"
        )
    cluster = clients.redis_client(settings.redis_url, "probe", cluster=True, decode_responses=True)
    try:
        primaries = cluster.get_primaries()
        for node in primaries:
            conn = cluster.get_redis_connection(node)
            at = f"{where}, master {node.host}:{node.port}"
            try:
                facts = {**conn.info("server"), **conn.info("memory"), **conn.info("persistence")}
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                problems.append(f"{at}: unreachable ({exc})")
                continue
            problems += redis_problems(at, facts)
    except redis.RedisError as exc:
        return 0, [*problems, f"{where}: the cluster's masters could not be listed ({exc})"]
    finally:
        cluster.close()
    return len(primaries), sorted(set(problems), key=problems.index)


# Kafka -----------------------------------------------------------------------------------------


def kafka_where(settings: Settings) -> str:
    how = settings.kafka_security_protocol
    if settings.kafka_sasl:
        how += f", {settings.kafka_sasl_mechanism} as {settings.kafka_sasl_username}"
    return f"kafka at {settings.kafka_bootstrap} ({how})"


def topic_problems(
    where: str,
    topic: str,
    partitions: int,
    expected_partitions: int,
    configs: Mapping[str, str],
    operations: Collection[str] | None,
) -> list[str]:
    """What keeps the event topic from being the project's log, one line each: its partitions
    (the contract's count), its retention (forever), what this user may do with it (``operations``:
    the broker's authorized operations, None when it does not say)."""
    problems = []
    if partitions != expected_partitions:
        problems.append(
            f"{where}: topic {topic} has {partitions} partitions, the contract's is {expected_partitions} "
            "(SOCIAL_EVENTS_PARTITIONS; a record's partition is part of its identity)"
        )
    wrong = {k: configs.get(k) for k, v in KEPT_FOREVER.items() if configs.get(k) != v}
    if wrong:
        problems.append(
            f"{where}: topic {topic} is not kept forever ("
            + ", ".join(f"{k}={v}" for k, v in wrong.items())
            + "; the log is the source of truth: "
            + ", ".join(f"{k}={v}" for k, v in KEPT_FOREVER.items())
            + ")"
        )
    if operations is not None:
        missing = [op for op in TOPIC_OPERATIONS if op not in operations and "ALL" not in operations]
        if missing:
            problems.append(
                f"{where}: not allowed to {', '.join(op.lower() for op in missing)} topic {topic} "
                f"(ACLs the project needs on it: {', '.join(o.title() for o in TOPIC_OPERATIONS)})"
            )
    return problems


def _connect(settings: Settings, timeout_s: float):
    """An admin client that has fetched the cluster's metadata, or one line: unreachable, refused
    by authentication, or a failed TLS handshake (librdkafka reports those two to ``error_cb``, not
    to the caller)."""
    from confluent_kafka import KafkaError, KafkaException

    where = kafka_where(settings)
    errors: list = []
    admin = clients.kafka_admin(settings, {"logger": _quiet, "error_cb": errors.append})
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=1)
            return admin
        except KafkaException as exc:
            last = exc.args[0]
        admin.poll(0)  # serves error_cb
        refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
        if refused:
            raise ExternalUnfit([f"{where}: authentication failed ({refused[-1].str()})"])
        untrusted = [e for e in errors if e.code() == KafkaError._SSL]
        if untrusted:
            raise ExternalUnfit([f"{where}: TLS handshake failed ({untrusted[-1].str()})"])
        if time.monotonic() > deadline:
            detail = (errors[-1] if errors else last).str()
            raise ExternalUnfit([f"{where}: unreachable ({detail})"])


def _describe(admin, topic: str, timeout_s: float):
    """(the topic's description, None) or (None, its error)."""
    from confluent_kafka import KafkaException, TopicCollection

    future = admin.describe_topics(
        TopicCollection([topic]), include_authorized_operations=True, request_timeout=timeout_s
    )[topic]
    try:
        return future.result(timeout=timeout_s), None
    except KafkaException as exc:
        return None, exc.args[0]


def _ensure_topic(
    admin, settings: Settings, topic: str, partitions: int, configs: Mapping[str, str], timeout_s: float
):
    """The topic's description, creating it first where it is missing; or one line."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    where = kafka_where(settings)
    described, error = _describe(admin, topic, timeout_s)
    if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
        # the cluster's own replication and min.insync.replicas (-1, left out): the local stack's
        # values (1 broker) would weaken a replicated cluster's guarantee
        kept = {k: v for k, v in configs.items() if k != "min.insync.replicas"}
        new = NewTopic(topic, num_partitions=partitions, replication_factor=-1, config=kept)
        try:
            admin.create_topics([new], operation_timeout=timeout_s)[topic].result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ExternalUnfit(
                    [
                        f"{where}: topic {topic} does not exist and this user may not create it ({exc.args[0].str()})"
                    ]
                ) from None
        # a new topic's metadata reaches every broker a moment after its creation is answered
        deadline = time.monotonic() + timeout_s
        while True:
            described, error = _describe(admin, topic, timeout_s)
            if (
                error is None
                or error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART
                or time.monotonic() > deadline
            ):
                break
            time.sleep(0.2)
    if error is not None:
        if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise ExternalUnfit(
                [
                    f"{where}: not allowed to describe topic {topic} "
                    f"(ACLs the project needs on it: {', '.join(o.title() for o in TOPIC_OPERATIONS)})"
                ]
            )
        raise ExternalUnfit([f"{where}: topic {topic}: {error.str()}"])
    return described


def _operations(described) -> list[str] | None:
    ops = described.authorized_operations
    return None if ops is None else [getattr(op, "name", str(op)) for op in ops]


def _topic_configs(admin, settings: Settings, topic: str, timeout_s: float) -> dict[str, str]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(
            timeout=timeout_s
        )
    except KafkaException as exc:
        raise ExternalUnfit(
            [f"{kafka_where(settings)}: cannot read the configuration of topic {topic} ({exc.args[0].str()})"]
        ) from None
    return {name: entry.value for name, entry in entries.items()}


def _may_create_compacted(admin, settings: Settings, timeout_s: float) -> str | None:
    """None if this user may create the speed layer's compacted topics (asked with a validation
    only, which creates nothing), else the problem."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    probe = f"{settings.events_topic}.external-check.profiles"
    new = NewTopic(probe, num_partitions=1, replication_factor=-1, config={"cleanup.policy": "compact"})
    try:
        admin.create_topics([new], validate_only=True, operation_timeout=timeout_s)[probe].result(
            timeout=timeout_s
        )
    except KafkaException as exc:
        if exc.args[0].code() in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        ):
            return (
                f"{kafka_where(settings)}: may not create the speed layer's compacted topics "
                f"{settings.events_topic}.<namespace>.profiles and .follows (ACL: Create on the prefix "
                f"{settings.events_topic}.; or SOCIAL_COMPACTED_TOPICS=0)"
            )
    return None


def check_kafka(settings: Settings, timeout_s: float = 15.0) -> str:
    """Check the Kafka at SOCIAL_KAFKA_BOOTSTRAP with the security settings, creating the event
    topic and the writer registry where they are missing and this user may; returns one line of
    what it found, or raises :class:`ExternalUnfit`."""
    where = kafka_where(settings)
    admin = _connect(settings, timeout_s)
    topic = settings.events_topic
    described = _ensure_topic(
        admin, settings, topic, settings.events_partitions, events_topic_configs(settings), timeout_s
    )
    problems = topic_problems(
        where,
        topic,
        len(described.partitions),
        settings.events_partitions,
        _topic_configs(admin, settings, topic, timeout_s),
        _operations(described),
    )
    registry = writers_topic(settings)
    try:
        kept = _ensure_topic(admin, settings, registry, 1, writers_topic_configs(settings), timeout_s)
    except ExternalUnfit as exc:
        problems += exc.problems
    else:
        ops = _operations(kept)
        missing = [op for op in ("READ", "WRITE") if ops is not None and op not in ops and "ALL" not in ops]
        if missing:
            problems.append(
                f"{where}: not allowed to {', '.join(m.lower() for m in missing)} the writer registry {registry}"
            )
    if settings.compacted_topics and (problem := _may_create_compacted(admin, settings, timeout_s)):
        problems.append(problem)
    if problems:
        raise ExternalUnfit(problems)
    return (
        f"{where}: topic {topic}, {len(described.partitions)} partitions, kept forever; registry {registry}"
    )


# The lake ------------------------------------------------------------------------------------------


def check_lake(settings: Settings) -> str:
    """Check the object store of an ``s3a://`` lake (SOCIAL_LAKE_URI): the bucket answers with the
    credentials, they may list, put, get and delete under the prefix, and the store refuses a
    second put-if-absent of one key (what keeps two writers' Delta commits apart); returns one
    line of what it found, or raises :class:`ExternalUnfit`."""
    from infra.lake_store import check_lake as probe

    problem, found = probe(settings)
    if problem:
        raise ExternalUnfit([problem])
    return found


def check_external(settings: Settings) -> list[str]:
    """Check every external component the settings name (none: nothing to do); one line each
    of what was found, or :class:`ExternalUnfit` with every problem, one line each."""
    found, problems = [], []
    for wanted, check in (
        (settings.redis_external, check_redis),
        (settings.kafka_external, check_kafka),
        (settings.lake_on_s3, check_lake),
    ):
        if not wanted:
            continue
        try:
            found.append(check(settings))
        except ExternalUnfit as exc:
            problems += exc.problems
    if problems:
        raise ExternalUnfit(problems)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name("infra.external"), description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    try:
        settings = get_settings()
        for line in check_external(settings):
            print(f"ok: {line}")
    except ExternalUnfit as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.external"))
