"""``make tail`` and the other Kafka tools the project runs get the security settings from a file
only its user reads, never on the command line. (Apart from tests/unit/test_clients.py, which
``make lint`` runs before ``make setup`` has fetched the Kafka jars this test needs.)"""

from __future__ import annotations

from infra import clients
from tests.unit.test_clients import sasl_settings


def test_kafkas_tools_get_the_security_from_a_file_only_its_user_reads(tmp_path):
    from infra import tail

    s = sasl_settings(var_dir=tmp_path)
    cmd = tail.command(s, "social.events", False, None)
    assert not any('p"w' in part for part in cmd)  # the password is not on the command line
    path = tmp_path / "run" / "tail-client.properties"
    assert cmd[cmd.index("--command-config") + 1] == str(path)
    assert path.stat().st_mode & 0o777 == 0o600
    lines = path.read_text().splitlines()
    assert "security.protocol=SASL_SSL" in lines
    # a properties file reads a backslash as an escape: the JAAS line's are doubled
    jaas = clients.java_kafka_security(s)["sasl.jaas.config"]
    assert f"sasl.jaas.config={jaas.replace(chr(92), chr(92) * 2)}" in lines
