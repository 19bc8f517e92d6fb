"""The tunings replicas share: what `polyc tune --cache redis://...` kept in the Redis
cache (`polyc/tune/shared.py`) is pulled into this replica's tuning file at start-up
and every `tuning_sync_s`, so its compiles use the tiles measured on any machine of its
CPU kind. The compile key covers the file (`tuning.fingerprint`): a pull that changes
it changes the keys, and no code built with older tiles is served for them."""
from __future__ import annotations

import asyncio
import logging

from ..tune import shared

log = logging.getLogger("polyc.server")


async def pull_tunings(url: str, timeout_s: float, *, quiet: bool = False) -> bool:
    """One pull, off the event loop; False (logged unless `quiet`) when Redis cannot be
    read."""
    import redis
    try:
        changed = await asyncio.to_thread(shared.pull, url, timeout_s=timeout_s)
    except (redis.RedisError, OSError) as e:
        if not quiet:
            log.warning("cannot read the shared tunings from %s (%s): tried again every "
                        "while, said again when it works", url, e)
        return False
    if changed:
        log.info("took %d tuning(s) from %s", changed, url)
    return True


async def follow_tunings(url: str, *, every_s: float, timeout_s: float) -> None:
    """Pull every `every_s` until cancelled; a failure is logged once, not every time."""
    failing = False
    while True:
        await asyncio.sleep(every_s)
        ok = await pull_tunings(url, timeout_s, quiet=failing)
        if ok and failing:
            log.info("the shared tunings at %s can be read again", url)
        failing = not ok
