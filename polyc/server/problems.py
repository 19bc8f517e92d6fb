"""Errors as RFC 9457 problem details (`application/problem+json`).

Every error the service answers is an `ApiProblem`: a status, a stable `type` URI, a
title, a human `detail`, and for invalid input an `errors` list whose items carry a JSON
pointer into the request body (`/graph/nodes/2/attrs/axis`) and polyc's own message.
Input values are never echoed back wholesale (a NaN could not even be serialised), and
messages are cut to a bounded length.
"""
from __future__ import annotations

import re
from itertools import islice
from typing import Any, Iterable

import orjson
from fastapi import Request
from fastapi.responses import Response

from ..errors import Problem

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:polyc:problem:"
MAX_MESSAGE = 2000
MAX_ERRORS = 50
MAX_INSTANCE = 200  # the request path, echoed as `instance`, is cut to this


class ApiProblem(Exception):
    def __init__(self, status: int, slug: str, title: str, detail: str,
                 errors: list[dict] | None = None, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = _cut(detail)
        self.errors = errors
        self.headers = headers or {}

    def body(self, instance: str | None = None) -> dict:
        out: dict[str, Any] = {"type": TYPE_PREFIX + self.slug, "title": self.title,
                               "status": self.status, "detail": self.detail}
        if instance is not None:
            out["instance"] = instance
        if self.errors is not None:
            out["errors"] = self.errors[:MAX_ERRORS]
        return out

    def response(self, request: Request | None = None) -> Response:
        instance = cut_path(request.url.path) if request is not None else None
        return Response(orjson.dumps(self.body(instance)), status_code=self.status,
                        media_type=PROBLEM_JSON, headers=self.headers)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f"... ({len(text)} chars)"


def cut_path(path: str) -> str:
    return path if len(path) <= MAX_INSTANCE else path[:MAX_INSTANCE] + "..."


def _escape(token: str | int) -> str:
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    """A JSON pointer (RFC 6901) from path tokens."""
    return "".join("/" + _escape(t) for t in tokens)


# -- pydantic errors ------------------------------------------------------------------------

def pydantic_errors(errors: Iterable[dict], prefix: tuple = ()) -> list[dict]:
    """Validation errors as problem items: pointer and message, never the input."""
    out = []
    for e in errors:
        loc = tuple(prefix) + tuple(e.get("loc", ()))
        out.append({"pointer": pointer(*loc), "message": _cut(str(e.get("msg", "invalid")))})
    return out


# -- polyc's graph problems -------------------------------------------------------------------

_INDEXED = re.compile(r"(inputs|constants|nodes)\[(\d+)\]")
_SECTIONS = ("inputs", "constants", "nodes")


class _Places:
    """Where each name is in the client's document: built once per answer, so wording
    many problems costs one pass over the nodes, not one pass per problem."""

    def __init__(self, doc: Any):
        self.by_section: dict[str, dict[str, int]] = {s: {} for s in _SECTIONS}
        if not isinstance(doc, dict):
            return
        for section in _SECTIONS:
            items = doc.get(section)
            if not isinstance(items, list):
                continue
            names = self.by_section[section]
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    continue
                name, outs = item.get("name"), item.get("outputs")
                if isinstance(name, str):
                    names.setdefault(name, i)
                elif (section == "nodes" and "name" not in item and isinstance(outs, list) and outs
                      and isinstance(outs[0], str)):
                    names.setdefault(outs[0], i)  # an unnamed node goes by its output

    def find(self, label: str, *, node_first: bool) -> tuple[str, int] | None:
        """Where the loader's label (a node or tensor name, or 'nodes[3]') is."""
        if m := _INDEXED.fullmatch(label):
            return m.group(1), int(m.group(2))
        order = ("nodes", "inputs", "constants") if node_first else ("inputs", "constants", "nodes")
        for section in order:
            if (i := self.by_section[section].get(label)) is not None:
                return section, i
        return None


def graph_pointer(places: _Places, p: Problem, root: tuple = ("graph",)) -> str:
    """Best-effort JSON pointer of the field a loader problem is about."""
    field = p.field or ""
    if m := _INDEXED.fullmatch(field):  # e.g. an entry of `inputs` that is not an object
        return pointer(*root, m.group(1), int(m.group(2)))
    tokens = field.split(".") if field else []
    if p.node is None:
        return pointer(*root, *tokens)
    found = places.find(p.node, node_first=p.op is not None)
    if found is None:
        return pointer(*root, *tokens)
    return pointer(*root, *found, *tokens)


def graph_errors(doc: Any, problems: Iterable[Problem], root: tuple = ("graph",)) -> list[dict]:
    """The first MAX_ERRORS problems as items (no more are answered)."""
    places = _Places(doc)
    return [{"pointer": graph_pointer(places, p, root), "message": _cut(str(p)), "node": p.node,
             "op": p.op, "field": p.field} for p in islice(problems, MAX_ERRORS)]
