"""Prometheus metrics in the text exposition format, without a client library: a few
counters, gauges and one histogram are all the service needs, and each update is a dict
operation on the event loop's thread."""
from __future__ import annotations

import bisect
from typing import Callable


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


class Counter:
    kind = "counter"

    def __init__(self, name: str, help: str):
        self.name, self.help = name, help
        self.values: dict[tuple, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self.values.get(tuple(sorted(labels.items())), 0.0)

    def samples(self):
        if not self.values:
            yield self.name, (), 0.0
        for key, v in sorted(self.values.items()):
            yield self.name, key, v


class Gauge:
    """Read when scraped, from a function."""

    kind = "gauge"

    def __init__(self, name: str, help: str, read: Callable[[], float]):
        self.name, self.help, self.read = name, help, read

    def samples(self):
        yield self.name, (), float(self.read())


class Histogram:
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help = name, help
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def samples(self):
        running = 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            yield f"{self.name}_bucket", (("le", repr(float(bound))),), float(running)
        yield f"{self.name}_bucket", (("le", "+Inf"),), float(self.count)
        yield f"{self.name}_sum", (), self.sum
        yield f"{self.name}_count", (), float(self.count)


class Metrics:
    def __init__(self):
        self.requests = Counter("polyc_http_requests_total",
                                "HTTP requests by method, route template and status")
        self.cache_hits = Counter("polyc_cache_hits_total",
                                  "compile requests answered from the cache")
        self.cache_misses = Counter("polyc_cache_misses_total",
                                    "compile requests that found no cache entry")
        self.cache_corrupt = Counter("polyc_cache_corrupt_entries_total",
                                     "cache entries that failed verification and were dropped")
        self.cache_errors = Counter("polyc_cache_errors_total",
                                    "cache backend operations that failed, by operation")
        self.coalesced = Counter("polyc_compile_coalesced_total",
                                 "misses answered by an identical compile already under way "
                                 "(here or in another replica)")
        self.compiles = Counter("polyc_compiles_total", "compiles run in workers, by outcome")
        self.compile_seconds = Histogram(
            "polyc_compile_seconds",
            "seconds spent in the pipeline's stages (gcc included) by successful compiles",
            (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0))
        self.fallbacks = Counter("polyc_compile_fallbacks_total",
                                 "budgets that ran out in successful compiles, by stage "
                                 "(fusion, schedule, tile): the stage took its fallback")
        self.worker_restarts = Counter("polyc_worker_restarts_total",
                                       "compile workers replaced, by reason")
        self.rejected = Counter("polyc_compile_rejected_total",
                                "compile requests refused with 503 because the queue was full")
        self.timeouts = Counter("polyc_http_timeouts_total",
                                "connections cut off because a request's headers (phase "
                                "header) or body (body) came too slowly, or because it sent "
                                "nothing (idle)")
        self._gauges: list[Gauge] = []

    def gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        self._gauges.append(Gauge(name, help, read))

    def render(self) -> str:
        out = []
        metrics = [self.requests, self.cache_hits, self.cache_misses, self.cache_corrupt,
                   self.cache_errors, self.coalesced, self.compiles, self.compile_seconds,
                   self.fallbacks,
                   self.worker_restarts, self.rejected, self.timeouts, *self._gauges]
        for m in metrics:
            out.append(f"# HELP {m.name} {m.help}")
            out.append(f"# TYPE {m.name} {m.kind}")
            for name, labels, value in m.samples():
                out.append(f"{name}{_labels(labels)} {value:.17g}")
        return "\n".join(out) + "\n"
