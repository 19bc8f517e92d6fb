"""Compile options every target reads; each target's options type extends `Options`.

Every field changes the generated code, so every field is in the cache key (`to_json`).
A value a target cannot use is a `GraphError` naming the option (`options.threads`),
never a crash later. JSON has arrays where the options have tuples: `from_json` takes
them back.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import GraphError, Problem

DEFAULT_MAX_OPERATIONS = 20_000_000  # isl's budget per question (`budget.py`)
MAX_TILE = 1 << 30  # tile sizes stay C ints
STAGES = ("fuse", "schedule", "tile")  # the stages with budgets, `<stage>_seconds` each
MAX_STAGE_SECONDS = 3600.0  # a wall budget past this is a typo: the service stops sooner


@dataclass(frozen=True)
class Options:
    parallel: bool = True  # threads or cores over outer parallel loops
    # budgets (`budget.py`): isl operations per question, and wall seconds per compile
    # for each stage; past one the stage falls back to a cheaper correct answer. The
    # wall ones sum to well under the service's 60 s limit, leaving gcc its time
    max_operations: int = DEFAULT_MAX_OPERATIONS
    fuse_seconds: float = 20.0
    schedule_seconds: float = 10.0
    tile_seconds: float = 10.0
    verify: bool = True  # check every schedule against every dependence
    fuse: bool = True  # let the graph layer fuse nodes (else one kernel per node)
    tile: bool = True  # tile permutable bands to fit the target's tile level
    tile_sizes: tuple[int, ...] | None = None  # explicit sizes instead of the memory model's
    microkernels: bool = True  # contractions and reductions onto hand-written kernels
    # a contraction reading what a row tail computed runs in the tail's nest (the cpu's:
    # attention's product with v on each block of softmax rows, one kernel); a symbolic
    # compile turns it off, since its tail cannot block the rows of every length
    tail_contraction: bool = True
    # kernels, by name, compiled without them (the portable loops): where a symbolic
    # compile's probes plan one kernel's microkernel by its sizes, that kernel alone
    portable_kernels: tuple[str, ...] = ()
    # edits a person makes in the browser view, as options so that they are cached and
    # reproducible: (kernel, sizes) tiles that kernel's permutable bands with the sizes;
    # (node, node) pairs of primitive nodes the fusion must merge (when isl finds a legal
    # shared loop, whatever the cost) or must keep apart
    kernel_tile_sizes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    fuse_force: tuple[tuple[str, str], ...] = ()
    fuse_forbid: tuple[tuple[str, str], ...] = ()

    def checks(self) -> list[tuple[str, bool, str]]:
        """(field, holds, message if not) for every constraint; subclasses add theirs."""
        return [
            ("max_operations", self.max_operations >= 1,
             f"must be at least 1, got {self.max_operations}"),
            *((f"{stage}_seconds", 0 <= getattr(self, f"{stage}_seconds") <= MAX_STAGE_SECONDS,
               f"must be 0 to {MAX_STAGE_SECONDS:g} seconds, got {getattr(self, f'{stage}_seconds')}")
              for stage in STAGES),
            ("tile_sizes", all(1 <= t <= MAX_TILE for t in self.tile_sizes or ()),
             f"sizes must be 1 to {MAX_TILE}, got {list(self.tile_sizes or ())}"),
            ("kernel_tile_sizes", all(len(e) == 2 and isinstance(e[0], str) and e[0] and e[1]
                                      and all(1 <= t <= MAX_TILE for t in e[1])
                                      for e in self.kernel_tile_sizes),
             f"must be pairs of a kernel name and a non-empty list of sizes 1 to {MAX_TILE}"),
            ("kernel_tile_sizes", self.tile or not self.kernel_tile_sizes,
             "needs options.tile (tiling is off)"),
            ("kernel_tile_sizes", len({k for k, _ in self.kernel_tile_sizes})
             == len(self.kernel_tile_sizes), "names a kernel twice"),
            *((name, all(len(p) == 2 and all(isinstance(n, str) and n for n in p) and p[0] != p[1]
                         for p in getattr(self, name)),
               "must be pairs of two different primitive node names")
              for name in ("fuse_force", "fuse_forbid")),
            ("fuse_force", self.fuse or not self.fuse_force, "needs options.fuse (fusion is off)"),
            ("portable_kernels", all(isinstance(n, str) and n for n in self.portable_kernels)
             and len(set(self.portable_kernels)) == len(self.portable_kernels),
             "must be different kernel names"),
        ]

    def named_kernels(self) -> list[tuple[str, str]]:
        """(field, kernel name) for every kernel an option names: each must exist."""
        return ([(f"kernel_tile_sizes.{k}", name)
                 for k, (name, _) in enumerate(self.kernel_tile_sizes)]
                + [(f"portable_kernels.{k}", name)
                   for k, name in enumerate(self.portable_kernels)])

    def uses_microkernels(self, kernel: str) -> bool:
        """Are microkernels on for the kernel named `kernel`?"""
        return self.microkernels and kernel not in self.portable_kernels

    def __post_init__(self):
        for stage in STAGES:  # 20 and 20.0 are one key
            seconds = getattr(self, f"{stage}_seconds")
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                object.__setattr__(self, f"{stage}_seconds", float(seconds))
        problems = [Problem(message, field=f"options.{name}")
                    for name, ok, message in self.checks() if not ok]
        if problems:
            raise GraphError(problems)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], target: str = "") -> "Options":
        """The options `to_json` wrote (arrays back to tuples); a name `cls` lacks is an
        error naming it (and the target it does not apply to)."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [k for k in doc if k not in known]
        if unknown:
            what = f"an option of target {target!r}" if target else f"an option of {cls.__name__}"
            raise GraphError([Problem(f"is not {what}", field=f"options.{k}") for k in unknown])
        hints = typing.get_type_hints(cls)
        # null is the default, as the service's schema says of an option whose default
        # differs between targets (cores)
        given = {k: v for k, v in doc.items() if v is not None or known[k].default is None}
        return cls(**{k: _tuples(v) if "tuple" in str(hints[k]) else v for k, v in given.items()})

    def to_json(self) -> dict:
        return {f.name: _lists(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to(self, cls: type["Options"], target: str) -> "Options":
        """These options as `cls` (another target's type): the fields both have are kept;
        a field `cls` lacks must be at its default, else it is an error naming it."""
        if type(self) is cls:
            return self
        mine = {f.name: f for f in dataclasses.fields(self)}
        theirs = {f.name for f in dataclasses.fields(cls)}
        foreign = [n for n, f in mine.items() if n not in theirs and getattr(self, n) != f.default]
        if foreign:
            raise GraphError([Problem(f"does not apply to target {target!r}", field=f"options.{n}")
                              for n in foreign])
        return cls(**{n: getattr(self, n) for n in mine if n in theirs})


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def _lists(v: Any) -> Any:
    return [_lists(x) for x in v] if isinstance(v, tuple) else v
