"""Reading and parsing a request body, refusing what could hurt the server.

In order: a content type other than JSON (415), a body over the size limit (413, checked
on the declared length and again while streaming), JSON nested deeper than the limit
(400, checked on the raw bytes before any parser recurses into it: a C parser can
overflow its stack on millions of '['), and text that is not strict JSON (400: NaN,
Infinity and numbers that overflow a double are refused, as polyc's loader does).
Integers beyond 64 bits (which orjson turns into floats) are refused with 422 naming
the number as sent and where it is; a float of that size is written with an exponent.
"""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import orjson
from fastapi import Request

from .problems import ApiProblem, pointer

# a JSON string literal (linear-time: no nested quantifiers)
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_STEP = np.zeros(256, dtype=np.int32)  # +1 for an opening bracket, -1 for a closing one
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_NOT_INTEGER_BEFORE = np.zeros(256, dtype=bool)  # a fraction's or an exponent's digits
_NOT_INTEGER_BEFORE[list(b".eE+-")] = True
_NOT_INTEGER_AFTER = np.zeros(256, dtype=bool)  # an integer part's, of a float
_NOT_INTEGER_AFTER[list(b".eE")] = True
INT_RANGE = (-(1 << 63), (1 << 64) - 1)


async def read_body(request: Request, max_bytes: int) -> bytes:
    ctype = request.headers.get("content-type")
    if ctype is not None:
        media = ctype.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ApiProblem(415, "unsupported-media-type", "Unsupported Media Type",
                             f"send the request body as application/json, not "
                             f"{media or 'an empty content type'!r}",
                             headers={"Accept-Post": "application/json"})
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_bytes: int) -> ApiProblem:
    return ApiProblem(413, "body-too-large", "Content Too Large",
                      f"the request body is over the limit of {max_bytes} bytes")


def nesting_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (strings skipped)."""
    if body.count(b"[") + body.count(b"{") <= 1:
        return body.count(b"[") + body.count(b"{")
    stripped = _STRING.sub(b'""', body)
    codes = np.frombuffer(stripped, dtype=np.uint8)
    return int(np.cumsum(_STEP[codes]).max(initial=0))


def parse_body(body: bytes, *, max_depth: int) -> Any:
    if not body.strip():
        raise ApiProblem(400, "invalid-json", "Invalid JSON",
                         "the request body is empty: expected a JSON object with a 'graph'")
    if body.count(b"[") + body.count(b"{") > max_depth and nesting_depth(body) > max_depth:
        raise ApiProblem(400, "too-deep", "JSON Nested Too Deeply",
                         f"the request body nests arrays and objects more than {max_depth} "
                         "levels deep")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ApiProblem(400, "invalid-json", "Invalid JSON", _explain(body, e)) from None
    if long_integer(body):
        # the text is strict JSON (orjson said so); Python's parser, about as fast and
        # rarely needed, reads integers of any size exactly
        _refuse_huge_integers(json.loads(body))
    return doc


def long_integer(body: bytes) -> bool:
    """Does strict JSON text hold an integer literal of 19 digits or more (maybe beyond
    int64 / uint64, which orjson cannot hold)? A float's digits are not one: float32
    weights written as doubles have 19 in a row after "0.00", and a regex for 19 digits
    sent every request with weights the slow way (1.3 s of a ResNet layer's 590K). Digits
    in a string may count: the slow way is right too."""
    codes = np.frombuffer(b"  " + body + b" ", dtype=np.uint8)  # spaces around the text
    edges = np.diff(((codes - np.uint8(ord("0"))) < 10).view(np.int8))  # wraps below "0"
    starts, ends = np.flatnonzero(edges == 1) + 1, np.flatnonzero(edges == -1) + 1
    long = ends - starts >= 19
    starts, ends = starts[long], ends[long]
    before = codes[starts - 1]
    # past a minus sign, the number's own or an exponent's: the text is strict JSON, so
    # what precedes it is e or E (an exponent) or not a number's at all
    before = np.where(before == ord("-"), codes[starts - 2], before)
    return bool((~_NOT_INTEGER_BEFORE[before] & ~_NOT_INTEGER_AFTER[codes[ends]]).any())


def _refuse_huge_integers(doc: Any) -> None:
    """422 naming the first integer outside 64 bits, as the client wrote it (no loop of
    polyc's takes one; orjson would have turned it into a float)."""
    stack: list[tuple[Any, tuple]] = [(doc, ())]
    while stack:  # iterative: the depth is bounded, but no recursion is needed
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, path + (k,)) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, path + (i,)) for i, v in reversed(list(enumerate(value))))
        elif type(value) is int and not INT_RANGE[0] <= value <= INT_RANGE[1]:
            where = pointer(*path)
            message = (f"the integer {value} is outside the 64-bit range polyc takes "
                       f"(a float of that size is written with an exponent, e.g. 1e+20)")
            raise ApiProblem(422, "invalid-request", "Invalid Request", f"{where}: {message}",
                             errors=[{"pointer": where, "message": message}])


def _explain(body: bytes, error: orjson.JSONDecodeError) -> str:
    """A message naming the problem, from orjson's own error and the bytes at its
    position: the body is never parsed a second time (16 MiB of invalid JSON would cost
    seconds of CPU again only to word the error)."""
    pos = error.pos
    if error.msg.startswith("str is not valid UTF-8"):
        return "invalid JSON: the body is not UTF-8 text"
    # orjson stops at NaN, or just after the sign of -Infinity
    near = body[max(0, pos - 1):pos + len(b"Infinity")]
    for token in (b"NaN", b"Infinity"):
        if token in near:
            return (f"invalid JSON: {token.decode()} is not valid JSON (NaN and Infinity are "
                    f"refused), at char {pos}")
    if "infinity when parsed" in error.msg:
        number = re.match(rb"[-+0-9.eE]{1,40}", body[pos:pos + 40])
        text = number.group().decode() if number else "here"
        return f"invalid JSON: the number {text} is too large for a double, at char {pos}"
    return f"invalid JSON: {error}"
