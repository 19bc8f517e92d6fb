"""A cache entry as one self-checking blob: a manifest naming each part with its size and
sha256, then the parts.

    polyc-bundle/1\\n
    {"key": ..., "created": ..., "parts": [{"name", "size", "sha256"}, ...]}\\n
    <sha256 of the manifest line, 64 hex digits>\\n
    <part bytes, in manifest order, back to back>

The blob is written as one value (one SQLite row, one Redis string), so it is published
atomically; `decode_bundle` checks every hash and length, so a corrupt or truncated
entry is detected and never served. The manifest names the key, so an entry copied
under another key is refused too.

With a secret (`POLYC_CACHE_SECRET`, shared by every replica), the line after the
manifest is HMAC-SHA256(secret, manifest) instead of its plain sha256: the manifest holds
the key and every part's hash, so whoever can write into the shared cache but does not
know the secret cannot make an entry any replica will serve.
"""
from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

import orjson

MAGIC = b"polyc-bundle/1\n"

# the parts of a compile result
RECORD = "record.json"  # everything but the source and the object: trees, report, timings
SOURCE = "kernels.c"
OBJECT = "kernels.so"


class CorruptBundle(Exception):
    """The stored blob does not match its manifest."""


@dataclass(frozen=True)
class Bundle:
    key: str
    created: float
    parts: dict[str, bytes]
    manifest: tuple[dict, ...]  # [{"name", "size", "sha256"}] in stored order
    size: int  # bytes of the encoded blob


def _seal(line: bytes, secret: bytes | None) -> bytes:
    if secret is None:
        return hashlib.sha256(line).hexdigest().encode()
    return hmac.new(secret, line, hashlib.sha256).hexdigest().encode()


def encode_bundle(key: str, parts: dict[str, bytes], *, created: float | None = None,
                  secret: bytes | None = None) -> bytes:
    manifest = {
        "key": key,
        "created": time.time() if created is None else created,
        "parts": [{"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                  for name, data in parts.items()],
    }
    line = orjson.dumps(manifest)  # one line: orjson escapes newlines inside strings
    return b"".join([MAGIC, line, b"\n", _seal(line, secret), b"\n", *parts.values()])


def decode_bundle(blob: bytes, key: str, *, secret: bytes | None = None) -> Bundle:
    """Parse and verify; raises CorruptBundle naming what is wrong."""
    if not blob.startswith(MAGIC):
        raise CorruptBundle("bad magic")
    end = blob.find(b"\n", len(MAGIC))
    if end < 0:
        raise CorruptBundle("truncated manifest")
    line = blob[len(MAGIC):end]
    digest = blob[end + 1:end + 65]
    if blob[end + 65:end + 66] != b"\n" or not hmac.compare_digest(_seal(line, secret), digest):
        raise CorruptBundle("manifest checksum mismatch" if secret is None else
                            "manifest signature mismatch (not written with this secret)")
    try:
        manifest = orjson.loads(line)
        entries = manifest["parts"]
        sizes = [int(e["size"]) for e in entries]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CorruptBundle(f"unreadable manifest: {e}") from None
    if manifest.get("key") != key:
        raise CorruptBundle("entry is filed under another key")
    offset = end + 66
    if len(blob) - offset != sum(sizes):
        raise CorruptBundle(f"payload is {len(blob) - offset} bytes, manifest says {sum(sizes)}")
    parts = {}
    view = memoryview(blob)
    for entry, size in zip(entries, sizes):
        data = view[offset:offset + size]
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise CorruptBundle(f"part {entry.get('name')!r} checksum mismatch")
        parts[entry["name"]] = bytes(data)
        offset += size
    return Bundle(key, float(manifest.get("created", 0.0)), parts, tuple(entries), len(blob))
