"""Failures remembered for a while, by content key: a graph that ran past the time limit,
or crashed a worker the same way twice, is answered at once when it comes again rather
than holding a worker for another minute. The key already names the graph, target,
options and every version, so a changed option or a new polyc is a new key. Marks expire:
an overloaded moment or a since-fixed host must not refuse a graph forever."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    kind: str  # "timeout" or "crash"
    detail: str  # what happened, for the answer
    at: float  # time.monotonic() when it happened
    expires: float


class Verdicts:
    def __init__(self, ttl_s: float, max_entries: int = 4096):
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._marks: OrderedDict[str, Verdict] = OrderedDict()

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, key: str, kind: str, detail: str) -> Verdict:
        now = time.monotonic()
        verdict = Verdict(kind, detail, now, now + self.ttl_s)
        self._marks.pop(key, None)
        self._marks[key] = verdict
        while len(self._marks) > self.max_entries:
            self._marks.popitem(last=False)
        return verdict

    def get(self, key: str) -> Verdict | None:
        verdict = self._marks.get(key)
        if verdict is not None and verdict.expires <= time.monotonic():
            del self._marks[key]
            return None
        return verdict
