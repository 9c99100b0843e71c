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

from infra import clients
from infra.cli import command_name, run_main
from infra.jars import kafka_classpath, require_java
from infra.kafka_admin import require_kafka
from infra.settings import Settings, get_settings

CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


def command(settings: Settings, topic: str, from_beginning: bool, max_messages: int | None) -> list[str]:
    cmd = [
        require_java(), "-Xmx256m", "-cp", kafka_classpath(settings), CONSOLE_CONSUMER,
        "--bootstrap-server", settings.kafka_bootstrap,
        "--topic", topic,
        "--formatter-property", "print.partition=true",
        "--formatter-property", "print.offset=true",
        "--formatter-property", "print.timestamp=true",
        "--formatter-property", "print.key=true",
        "--command-config", str(clients.java_security_file(settings, settings.run_dir / "tail-client.properties")),
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
    require_kafka(settings)  # the console consumer would wait for a broker in silence
    cmd = command(settings, a.topic, a.from_beginning, a.max_messages)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(run_main(main, "infra.tail"))
