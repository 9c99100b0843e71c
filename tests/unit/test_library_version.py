"""The Redis libraries are identified by their content (docs/architecture.md, "Upgrading").

Each library's version, what ``social_version`` / ``p_version`` answer, is its VERSION line and a
digest of the source Redis loads (for ``partitioned.lua`` with ``protocol.json``), so an edit of
the Lua without a bump of the VERSION line is loaded at the next start, and verify can tell a
Redis that runs another one. Checked against a real redis-server.
"""

from __future__ import annotations

import redis

from contract import functions


def test_an_edit_without_a_version_bump_is_a_new_version_and_is_loaded(redis_url, tmp_path, monkeypatch):
    r = redis.Redis.from_url(redis_url)
    functions.ensure_loaded(r)
    before = functions.version()
    assert functions.loaded_versions(r)["social"] == before
    edited = tmp_path / "social.lua"
    # a behaviour change with the VERSION line as it was: `social_version` answers something else
    edited.write_text(functions.LIBRARY.read_text() + "\n-- an edit\n")
    monkeypatch.setattr(functions, "LIBRARY", edited)
    after = functions.version()
    assert after != before and after.split("-")[0] == before.split("-")[0]
    assert functions.loaded_versions(r)["social"] == before  # Redis still runs the old one: stale
    functions.ensure_loaded(r)
    assert functions.loaded_versions(r)["social"] == after


def test_the_source_redis_loads_names_its_own_version():
    assert f"local VERSION = '{functions.version()}'" in functions.source()
    assert f"local VERSION = '{functions.partitioned_version()}'" in functions.partitioned_source()


def test_the_protocol_is_part_of_the_partitioned_librarys_version(tmp_path, monkeypatch):
    before = functions.partitioned_version()
    changed = tmp_path / "protocol.json"
    changed.write_text(functions.PROTOCOL_FILE.read_text().replace('"reason"', '"why"', 1))
    monkeypatch.setattr(functions, "PROTOCOL_FILE", changed)
    assert functions.partitioned_version() != before
