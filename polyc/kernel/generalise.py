"""Generalising IR values compiled at several sizes into one symbolic value.

A symbolic graph is compiled at a few bindings of its symbols ("probes": a base value
per symbol, one probe per symbol that moves only that symbol, and one that moves them
all further). `generalise` walks the results of the probes side by side (dataclasses,
tuples, FrozenDicts) and demands that they agree everywhere except in integers; an
integer that differs must be an affine function of the symbols (`b + sum a_k * s_k`,
integer coefficients), fitted on the base and per-symbol probes and confirmed on the
last one. So an extent of `N` rows, an offset of `N - 1`, a size of `64*N` become
sympy expressions; a float that differs must be the reciprocal of such a function (the
1/N of a mean over a symbolic axis, exactly at every probe) and becomes a `Reciprocal`;
anything else that changed with the size (a tile chosen differently, a constant
sqrt(N)) is a `NotGeneral` naming where. A sequence whose length differs must be
0, 1, ..., n - 1 at every probe, n affine (a constant's positions): an `Iota`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from ..graph.ir import FrozenDict
from ..graph.symbols import Iota, Reciprocal, symbol

BASE = 1009  # the first probe: about a thousand, and prime (see `choose_probes`)


class NotGeneral(Exception):
    """The probes disagree in a way no affine function of the symbols explains;
    `final` when compiling again with other options cannot help; `kernel` the kernel
    whose own decisions differ (its tree, marks, copies, code), when one does."""

    def __init__(self, where: str, values: Sequence[Any], *, final: bool = False):
        super().__init__(f"{where}: {', '.join(map(str, values))} at the probes")
        self.where = where
        self.final = final
        self.kernel: str | None = None  # set where it is raised about one kernel


def choose_probes(ranges: Mapping[str, tuple[int, int]]) -> list[dict[str, int]]:
    """The bindings to compile at: base, one per symbol that moves it, then all moved
    further. Each symbol takes three primes, from 1009 (or its minimum) up: 1009, 1013,
    1019 for the first, the next three for the second; the largest in its range when
    they do not fit: sizes no tile divides evenly, so that no decision at the probes
    hinges on divisibility. A range with too
    few primes takes its top values; a symbol with fewer than three values is probed at
    all of them (its fit is then exact on its whole range)."""
    base, moved, further = {}, {}, {}
    start = BASE
    for name, (lo, hi) in sorted(ranges.items()):
        values = _primes_from(max(start, lo), hi, 3)
        if len(values) == 3:
            start = values[-1] + 1
        else:
            values = _primes_down(hi, max(lo, 2), 3)
            if len(values) < 3:
                values = [v for v in (hi, hi - 1, hi - 2) if v >= lo] or [hi]
        values += [values[-1]] * (3 - len(values))
        base[name], moved[name], further[name] = values
    probes = [dict(base)]
    for name in sorted(ranges):
        probes.append({**base, name: moved[name]})
    probes.append(dict(further))
    return probes


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def _primes_from(n: int, hi: int, count: int) -> list[int]:
    out = []
    while len(out) < count and n <= hi:
        if _is_prime(n):
            out.append(n)
        n += 1
    return out


def _primes_down(n: int, lo: int, count: int) -> list[int]:
    out = []
    while len(out) < count and n >= lo:
        if _is_prime(n):
            out.append(n)
        n -= 1
    return out


def generalise(values: Sequence[Any], probes: Sequence[Mapping[str, int]], where: str,
               names: Mapping[str, str] | None = None) -> Any:
    """One value for all probes (see the module's doc). `names` renames the symbols in
    the expressions made (e.g. to their C names)."""
    first = values[0]
    if type(first) is float and all(type(v) is float for v in values):
        if any(v != first for v in values):
            return _fit_reciprocal(values, probes, where, names or {})
        return first
    if isinstance(first, bool) or first is None or isinstance(first, (str, float)):
        if any(v != first for v in values):
            raise NotGeneral(where, values)
        return first
    if isinstance(first, int):
        return _fit(values, probes, where, names or {})
    if isinstance(first, (tuple, list)):
        if any(not isinstance(v, type(first)) for v in values):
            raise NotGeneral(where, [type(v).__name__ for v in values])
        if any(len(v) != len(first) for v in values):
            return _fit_iota(values, probes, where, names or {})
        out = [generalise([v[i] for v in values], probes, f"{where}[{i}]", names)
               for i in range(len(first))]
        return type(first)(out)
    if isinstance(first, FrozenDict):
        if any(tuple(v) != tuple(first) for v in values):
            raise NotGeneral(where, [tuple(v) for v in values])
        return FrozenDict({k: generalise([v[k] for v in values], probes, f"{where}.{k}", names)
                           for k in first})
    if dataclasses.is_dataclass(first):
        if any(type(v) is not type(first) for v in values):
            raise NotGeneral(where, [type(v).__name__ for v in values])
        changes = {}
        for f in dataclasses.fields(first):
            if not f.init:
                continue
            parts = [getattr(v, f.name) for v in values]
            general = generalise(parts, probes, f"{where}.{f.name}", names)
            if general is not parts[0]:
                changes[f.name] = general
        return dataclasses.replace(first, **changes) if changes else first
    if any(v != first for v in values):
        raise NotGeneral(where, values)
    return first


def _fit(values: Sequence[int], probes: Sequence[Mapping[str, int]], where: str,
         names: Mapping[str, str]):
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise NotGeneral(where, values)
    if all(v == values[0] for v in values):
        return values[0]
    base = probes[0]
    coeffs = {}
    for k, name in enumerate(sorted(base)):
        step = probes[1 + k][name] - base[name]
        delta = values[1 + k] - values[0]
        if step == 0:
            if delta:
                raise NotGeneral(where, values)
            continue
        if delta % step:
            raise NotGeneral(where, values)
        coeffs[name] = delta // step
    const = values[0] - sum(c * base[n] for n, c in coeffs.items())
    check = probes[-1]
    if const + sum(c * check[n] for n, c in coeffs.items()) != values[-1]:
        raise NotGeneral(where, values)
    expr = const
    for name, c in coeffs.items():
        if c:
            expr = expr + c * symbol(names.get(name, name))
    return expr


def _fit_reciprocal(values: Sequence[float], probes: Sequence[Mapping[str, int]], where: str,
                    names: Mapping[str, str]) -> Reciprocal:
    """Floats that are exactly 1/c at every probe, c an affine function of the symbols."""
    counts = []
    for v in values:
        c = round(1.0 / v) if math.isfinite(v) and v > 0 else 0
        if c < 1 or 1.0 / c != v:
            raise NotGeneral(where, values)
        counts.append(c)
    try:
        return Reciprocal(_fit(counts, probes, where, names))
    except NotGeneral:
        raise NotGeneral(where, values) from None


def _fit_iota(values: Sequence[Sequence], probes: Sequence[Mapping[str, int]], where: str,
              names: Mapping[str, str]) -> Iota:
    """Sequences that are 0, 1, ..., n - 1 at every probe, n an affine function."""
    lengths = [len(v) for v in values]
    if any(tuple(v) != tuple(range(n)) for v, n in zip(values, lengths)):
        raise NotGeneral(where, [f"{len(v)} values" for v in values])
    return Iota(_fit(lengths, probes, where, names))
