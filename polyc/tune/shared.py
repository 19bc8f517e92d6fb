"""Tunings shared through the service's Redis cache, so every replica uses them.

`polyc tune --cache redis://...` publishes what it kept into one Redis hash beside the
service's bundles (field: the tuning key, value: the record as JSON); each replica of
`polyc serve` on that Redis pulls the hash into its own tuning file now and then
(`pull`), and its compile keys change with the file (`tuning.fingerprint`), so no
replica serves code built with older tiles.

A record only chooses a microkernel and tile sizes, made legal where they are read
(`targets/cpu/tiles.py`), so a forged one can slow a kernel down but not make it wrong;
records not of the expected shape, or with tiles past `MAX_TILE` (whose blocks would
take more memory than any cache level holds), are ignored.
"""
from __future__ import annotations

import json

from ..errors import PolycError
from ..microkernels.registry import by_name
from ..targets.cpu import tuning
from ..targets.cpu.winograd import TILES

TABLE = "polyc:v1:tuning"  # beside the service's "polyc:v1:bundle:<key>" entries
MAX_TILE = 1 << 13


def is_shared(url: str | None) -> bool:
    """Whether a cache URL is one replicas share (only a Redis one is)."""
    return bool(url) and url.startswith(("redis://", "rediss://", "unix://"))


def _client(url: str, timeout_s: float):
    import redis
    return redis.Redis.from_url(url, socket_timeout=timeout_s,
                                socket_connect_timeout=timeout_s)


def publish(url: str, entries: list[tuple[str, dict]], *, timeout_s: float = 5.0) -> None:
    """Store (key, record) entries in the shared table (over older ones)."""
    import redis
    if not entries:
        return
    client = _client(url, timeout_s)
    try:
        client.hset(TABLE, mapping={k: json.dumps(v, sort_keys=True) for k, v in entries})
    except redis.RedisError as e:
        raise PolycError(f"kept in this machine's tuning file, but not shared: the cache "
                         f"{url} cannot be written ({e})") from None
    finally:
        client.close()


def pull(url: str, *, timeout_s: float = 1.0) -> int:
    """Take the shared table into this machine's tuning file; returns how many entries
    changed. Raises redis's errors when Redis cannot be reached."""
    client = _client(url, timeout_s)
    try:
        raw = client.hgetall(TABLE)
    finally:
        client.close()
    entries = {}
    for key, value in raw.items():
        record = _record(value)
        if record is not None:
            entries[key.decode(errors="replace")] = record
    return tuning.merge(entries)


def _record(value: bytes) -> dict | None:
    """A tuning record as `tuning.store` writes it, or None for anything else."""
    try:
        record = json.loads(value)
        by_name(record["microkernel"])
        tiles, winograd = record["tiles"], record.get("winograd", 0)
        ok = (isinstance(record["seconds"], (int, float)) and type(winograd) is int
              and (tiles == {} and winograd in TILES  # a Winograd tile's products' kernel
                   or winograd == 0 and set(tiles) == {"kc", "mc", "nc"}
                   and all(type(v) is int and 0 < v <= MAX_TILE for v in tiles.values())))
    except (ValueError, TypeError, KeyError, AttributeError, StopIteration):
        return None
    return record if ok else None
