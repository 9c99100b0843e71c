"""``infra.redis_copy.frozen_copy``: a point-in-time copy of a running Redis (verify compares there).

Against a real redis-server (the module's own, ``redis_url``) and real copies of it: the copy holds
what the source held when it was made, function libraries included, and nothing written after;
its server is gone once the block ends; a source that cannot be copied is a :class:`CopyError`
naming it, not a hang.
"""

from __future__ import annotations

import pytest
import redis

from infra.redis_copy import CopyError, frozen_copy
from infra.stack import free_port_block

LIB = "#!lua name=copytest\nredis.register_function('copytest_one', function() return 1 end)"


def test_the_copy_holds_the_source_at_one_moment_and_nothing_written_after(redis_url, tmp_path):
    source = redis.Redis.from_url(redis_url)
    source.flushall()
    source.function_load(LIB, replace=True)
    source.hset("h", mapping={str(i): i for i in range(1000)})
    source.zadd("z", {f"m{i}": i for i in range(500)})
    with frozen_copy(redis_url, tmp_path / "copy") as url:
        assert url != redis_url
        copy = redis.Redis.from_url(url)
        source.hset("h", "after", 1)  # the live writers go on; the copy does not follow
        source.delete("z")
        assert copy.hlen("h") == 1000 and not copy.hexists("h", "after")
        assert copy.zcard("z") == 500
        assert copy.fcall("copytest_one", 0) == 1  # the libraries come with the data
        copy.set("scratch", 1)  # a scratch namespace lives in the copy, not in the source
        assert source.get("scratch") is None
        assert copy.info("replication")["role"] == "master"  # detached
    try:
        copy.ping()
        raise AssertionError("the copy's server still answers after the block")
    except redis.ConnectionError:
        pass
    assert not (tmp_path / "copy").exists()


def test_a_source_that_does_not_answer_is_a_copy_error_naming_it(tmp_path):
    port = free_port_block(1)
    try:
        with frozen_copy(f"redis://127.0.0.1:{port}/0", tmp_path / "copy", timeout_s=3):
            raise AssertionError("copied a Redis that does not run")
    except CopyError as exc:
        assert f"127.0.0.1:{port} did not sync in 3 s" in str(exc)
    assert (tmp_path / "copy" / "redis.log").exists()  # kept, for the reason


@pytest.mark.redis_cluster
def test_a_cluster_is_copied_at_one_instant_across_its_masters(redis_cluster, tmp_path):
    """A writer counts on two masters in turn, x then y, each write answered before the next: at
    every instant x == y or x == y + 1. Masters copied one after the other break that as soon as
    one count happened between the two copies (y ahead of x, or x two ahead); a copy at one instant
    never does. And the copy is one server with every master's keys."""
    import threading

    from infra import clients

    cluster = clients.redis_client(redis_cluster.url)
    x, y = "copy:{a}", "copy:{b}"  # hash tags whose slots two different masters own
    assert cluster.nodes_manager.get_node_from_slot(cluster.keyslot(x)) != (
        cluster.nodes_manager.get_node_from_slot(cluster.keyslot(y))
    )
    cluster.mset_nonatomic({x: 0, y: 0, **{f"copy:filler:{i}": i for i in range(2000)}})
    stop = threading.Event()

    def count():
        while not stop.is_set():
            cluster.incr(x)
            cluster.incr(y)

    writer = threading.Thread(target=count)
    writer.start()
    try:
        held = []
        for n in range(3):
            with frozen_copy(redis_cluster.url, tmp_path / f"copy{n}") as url:
                copy = redis.Redis.from_url(url)
                assert copy.dbsize() == 2002  # every master's keys, in one server
                held.append((int(copy.get(x)), int(copy.get(y))))
    finally:
        stop.set()
        writer.join()
    assert held[-1][0] > held[0][0] + 100, held  # the writer went on while copies were taken
    assert all(a - b in (0, 1) for a, b in held), held


@pytest.mark.redis_cluster
def test_a_cluster_that_refuses_to_be_paused_is_a_copy_error(redis_cluster, tmp_path):
    """A managed cluster may not let the project's user pause it: no copy at one instant, a
    CopyError naming why (verify then compares in place), and no master left paused."""
    from infra import clients

    for port in redis_cluster.ports:
        node = clients.redis_client(f"redis://127.0.0.1:{port}/0", "probe", cluster=False)
        node.acl_setuser("nopause", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                         commands=["+@all", "-client|pause"])  # fmt: skip
    url = f"redis://nopause:pw@127.0.0.1:{redis_cluster.ports[0]}/0"
    with pytest.raises(CopyError, match="refused CLIENT PAUSE"):
        with frozen_copy(url, tmp_path / "copy"):
            raise AssertionError("copied a cluster it could not pause")
    cluster = clients.redis_client(redis_cluster.url)
    cluster.set("copy:after-refusal", 1)  # a write goes through: nothing is paused
    assert cluster.get("copy:after-refusal") == b"1"
