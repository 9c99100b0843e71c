"""``make tail``: the event log, record by record, with Kafka's own console consumer.

``python -m infra.tail [--topic T] [--from-beginning] [--max-messages N]``: runs
``kafka-console-consumer`` (``org.apache.kafka.tools.consumer.ConsoleConsumer``) from the
checksum-verified Kafka jars ``make setup`` fetched, against ``SOCIAL_KAFKA_BOOTSTRAP``, printing
each record's partition, offset, append time, key and value. Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from infra import clients
from infra.cli import command_name
from infra.jars import kafka_classpath, require_java
from infra.settings import Settings, get_settings

CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


def client_config(settings: Settings) -> Path:
    """The console consumer's security properties (infra.clients: the SASL password too) in a file
    only this user reads, not on its command line, where every user's `ps` would show them."""
    path = settings.run_dir / "tail-client.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    props = clients.java_kafka_security(settings)
    path.write_text("".join(f"{k}={_escaped(v)}\n" for k, v in props.items()))
    return path


def _escaped(value: str) -> str:
    """A value as a Java properties file reads it back (backslashes and line ends escaped)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def command(settings: Settings, topic: str, from_beginning: bool, max_messages: int | None) -> list[str]:
    cmd = [
        require_java(), "-Xmx256m", "-cp", kafka_classpath(settings), CONSOLE_CONSUMER,
        "--bootstrap-server", settings.kafka_bootstrap,
        "--topic", topic,
        "--formatter-property", "print.partition=true",
        "--formatter-property", "print.offset=true",
        "--formatter-property", "print.timestamp=true",
        "--formatter-property", "print.key=true",
        "--command-config", str(client_config(settings)),
    ]  # fmt: skip
    if from_beginning:
        cmd.append("--from-beginning")
    if max_messages:
        cmd += ["--max-messages", str(max_messages), "--timeout-ms", "20000"]
    return cmd


def main(argv: list[str] | None = None) -> int:
    settings = get_settings()
    p = argparse.ArgumentParser(prog=command_name("infra.tail"), description=__doc__.splitlines()[0])
    p.add_argument("--topic", default=settings.events_topic)
    p.add_argument(
        "--from-beginning", action="store_true", help="the whole retained log, not only new records"
    )
    p.add_argument("--max-messages", type=int, help="stop after this many records")
    a = p.parse_args(argv)
    cmd = command(settings, a.topic, a.from_beginning, a.max_messages)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
