"""`s3body.BodyBuffers`: a body's buffer is used again only once nothing refers to it, and the buffers kept stay
within their bound, whatever sizes the bodies come in."""

from __future__ import annotations

from tierproxy.tier.s3body import BodyBuffers

MiB = 1 << 20


def test_a_buffer_held_anywhere_is_never_handed_out_again() -> None:
    pool = BodyBuffers(keep_bytes=4 * MiB)
    a = pool.take(MiB)
    view = memoryview(a)[10:20]  # an answer's view: the buffer itself is no longer named
    del a
    cached = {"chunk": pool.take(MiB)}  # a cache entry
    b = pool.take(MiB)
    assert pool.reused == 0 and len({id(view.obj), id(cached["chunk"]), id(b)}) == 3
    del b
    c = pool.take(MiB)  # `b`'s buffer: nothing refers to it any more
    assert pool.reused == 1 and c is not view.obj and c is not cached["chunk"]
    view.release()
    cached.clear()
    d, e = pool.take(MiB), pool.take(MiB)
    assert pool.reused == 3 and len({id(c), id(d), id(e)}) == 3


def test_kept_buffers_stay_within_their_bound_across_sizes() -> None:
    pool = BodyBuffers(keep_bytes=3 * MiB)
    held = [pool.take(MiB) for _ in range(5)]  # two beyond the bound: handed out, not kept
    assert pool.kept_bytes == 3 * MiB and len(pool.kept) == 3 and all(len(b) == MiB for b in held)
    held.clear()
    big = pool.take(2 * MiB)  # no room: unused 1 MiB ones of the other size let go of to make it
    assert len(big) == 2 * MiB and pool.kept_bytes == 3 * MiB
    assert sorted(len(b) for b in pool.kept) == [MiB, 2 * MiB]
    assert pool.take(2 * MiB) is not big  # `big` is held here: a new one, not kept (letting the unused 1 MiB
    assert sorted(len(b) for b in pool.kept) == [MiB, 2 * MiB]  # one go would not make room for it)


def test_small_bodies_and_no_bound_are_not_kept() -> None:
    assert BodyBuffers(keep_bytes=0).take(MiB) is not None
    pool = BodyBuffers(keep_bytes=8 * MiB)
    pool.take(1000)
    pool.take(0)
    assert pool.kept == [] and pool.kept_bytes == 0


def test_a_chunk_cached_reader_on_s3_keeps_its_caches_worth_of_bodies() -> None:
    from tierproxy.remote.reader import RemoteReader
    from tierproxy.tier.rsm import RemoteStorageManager
    from tierproxy.tier.storage import S3Store

    store = S3Store("bucket1", endpoint="http://127.0.0.1:9", region="us-east-1", access_key="a", secret_key="b")
    assert store.bodies.keep_bytes == 0  # the tier job's and restore's stores keep none
    RemoteReader(RemoteStorageManager(store), chunk_bytes=8 * MiB, cache_bytes=64 * MiB)
    assert store.bodies.keep_bytes == 72 * MiB  # the cache's bound and the chunk coming in while it is full
