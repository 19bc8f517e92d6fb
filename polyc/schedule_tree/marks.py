"""Typed marks: every decision a pass records in a schedule tree, printed and parsed here.

A mark is an isl id on a mark node; its text is `word` followed by the mark's fields,
positional ones first, then `name=value` ones:

    parallel                      threads share the loop below (`parallel threads=4`: a
                                  fixed team)
    partials t3_s                 each thread reduces into its own copy of these arrays
    simd / reduce / stream        the loop below vectorises; only float reductions'
                                  own dependences cross it; its output is streamed
    column_block 2048             the band below runs over blocks of 2048 columns
    microkernel sgemm_avx2_6x16 S0   the statements below become one kernel call
    gemm S0 sgemm_avx2_6x16 m=1024 n=1024 k=1024 mc=350 nc=1024 kc=344 par=inner
         threads=0 loops=pc,ic,jr,ir b=packed   a contraction's BLIS-shaped plan
    pack_a S0 / pack_b S0         A's block, B's block copied into the kernel's panels
    team_for S0                   the tile loop below is shared by the team
    b_rows S0                     B is read in place by rows (conv2d's window rows)
    tile LDM tile                 one tile runs below: its data is promoted to the LDM
    winograd S0 sgemm_avx512_8x48 tile=4 rows=24 par=blocks weights=const
                                  a 3x3 convolution by Winograd's F(4x4, 3x3), its
                                  products on that kernel

`parse(text)` gives the typed mark, `str(mark)` its text: no pass splits mark text by
hand. Every printed tree (`--print-after-all`, the service, the browser view) shows
these texts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..graph.symbols import parse_affine

_KINDS: dict[str, type["Mark"]] = {}


@dataclass(frozen=True)
class Mark:
    word: ClassVar[str] = ""
    positional: ClassVar[tuple[str, ...]] = ()  # fields printed without their name

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.word:
            _KINDS[cls.word] = cls

    def __str__(self) -> str:
        words = [self.word]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self.positional:
                words += list(value) if isinstance(value, tuple) else [str(value)]
            elif value != f.default:
                text = ",".join(map(str, value)) or "-" if isinstance(value, tuple) else value
                words.append(f"{f.name}={text}")
        return " ".join(words)

    @classmethod
    def _parse(cls, words: list[str]) -> "Mark":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict = {}
        pos = [w for w in words if "=" not in w]
        for name in cls.positional:
            if fields[name].type in ("tuple[str, ...]",):
                values[name], pos = tuple(pos), []
            else:
                values[name] = _typed(fields[name], pos.pop(0))
        for w in words:
            if "=" in w:
                name, text = w.split("=", 1)
                values[name] = _typed(fields[name], text)
        return cls(**values)


def _typed(f: dataclasses.Field, text: str):
    if f.type == "int":
        # a symbolic kernel's sizes are affine expressions of its symbols
        return int(text) if text.lstrip("-").isdigit() else parse_affine(text)
    if f.type == "tuple[str, ...]":
        return () if text == "-" else tuple(text.split(","))
    return text


def parse(text: str) -> Mark:
    """The typed mark of a mark's text; a word no pass defines is a ValueError."""
    words = text.split()
    kind = _KINDS.get(words[0]) if words else None
    if kind is None:
        raise ValueError(f"unknown schedule-tree mark {text!r}")
    return kind._parse(words[1:])


def word(text: str) -> str:
    """The kind of a mark's text, without parsing its fields."""
    return text.split(" ", 1)[0]


@dataclass(frozen=True)
class Parallel(Mark):
    word: ClassVar[str] = "parallel"
    threads: int = 0  # a fixed team (0: the runtime's)
    # a symbolic kernel's: the statement instances below, an affine expression of its
    # symbols; the threads run only when a call has enough of them (the cpu's `if`)
    work: int = 0


@dataclass(frozen=True)
class Partials(Mark):
    word: ClassVar[str] = "partials"
    positional: ClassVar[tuple[str, ...]] = ("arrays",)
    arrays: tuple[str, ...] = ()


@dataclass(frozen=True)
class Simd(Mark):
    word: ClassVar[str] = "simd"


@dataclass(frozen=True)
class Reduce(Mark):
    word: ClassVar[str] = "reduce"


@dataclass(frozen=True)
class Stream(Mark):
    word: ClassVar[str] = "stream"


@dataclass(frozen=True)
class ColumnBlock(Mark):
    word: ClassVar[str] = "column_block"
    positional: ClassVar[tuple[str, ...]] = ("size",)
    size: int = 0


@dataclass(frozen=True)
class Microkernel(Mark):
    word: ClassVar[str] = "microkernel"
    positional: ClassVar[tuple[str, ...]] = ("kernel", "stmt")
    kernel: str = ""
    stmt: str = ""


@dataclass(frozen=True)
class Tiles:
    mc: int
    nc: int
    kc: int

    def to_json(self) -> dict:
        return {"mc": self.mc, "nc": self.nc, "kc": self.kc}


@dataclass(frozen=True)
class Gemm(Mark):
    """A contraction's plan: everything codegen needs beyond the kernel's statements."""

    word: ClassVar[str] = "gemm"
    positional: ClassVar[tuple[str, ...]] = ("stmt", "kernel")
    stmt: str = ""
    kernel: str = ""  # registry name of the microkernel
    m: int = 0
    n: int = 0
    k: int = 0
    mc: int = 0
    nc: int = 0
    kc: int = 0
    # 'inner' (the team shares each tile loop) | 'rows' (each thread takes whole row
    # blocks, the ic loop) | 'batch' | 'none'
    par: str = "none"
    threads: int = 0  # 0: the runtime's team
    loops: tuple[str, ...] = ()  # tile loops present, outermost first
    # 'packed' | 'rows': B read in place, no pack_b | 'folded': packed, with the batch
    # dims only B reads as columns (`analysis.gemm_view(fold=True)`) | 'const': a
    # constant, packed whole on the kernel's first call and kept (`plan.constant_operand`)
    b: str = "packed"
    # d: a tile of C whose every element has column > row + d is masked by what reads
    # it (`analysis.masked_columns`: causal attention's scores) and is not computed
    masked: str = "-"
    # d: A is 0 past K index row + d (`analysis.masked_depth`: causal attention's
    # probabilities): each tile stops its K steps there when B is finite
    depth: str = "-"
    # 'packed' | 'rows': A read in place, row i at A + i * lda (`analysis.a_row_stride`) |
    # 'once': packed whole before the loop over images, not once per image (`plan.packs_a_once`) |
    # 'const': a constant, packed whole on the kernel's first call and kept (`plan.constant_operand`)
    a: str = "packed"
    # the kernel of the row tail's contraction (`GemmView.then`: attention's
    # probabilities times v), A read in place by its `a_rows_variant`
    then: str = ""
    # d: that contraction's A is 0 past K index row + d (as `depth`)
    then_depth: str = "-"
    # r: with B read in place by a window kernel, each column tile covers r whole output
    # rows, the tiles starting at each (`jy` loop, then `jr` within a row:
    # `plan.row_tiles`); 0: a tile every nr virtual columns
    row_tile: int = 0
    # 9: B's K rows are a 3x3 window's taps over its channels, read by the kernel's
    # `b_taps_variant` (`analysis.window_taps`)
    taps: int = 0
    # 1: B read in place from a copy made per batch point, inside the batch loop
    # (`BRows.slices`): decided at the plan's sizes, which codegen's may not be (a symbol)
    sliced: int = 0

    @property
    def tiles(self) -> Tiles:
        return Tiles(self.mc, self.nc, self.kc)

    def whole(self, side: str) -> bool:
        """Is the operand on `side` ('a' or 'b') packed whole, under the gemm mark (`a=once`,
        `a=const`, `b=const`), rather than block by block under its pack mark?"""
        return self.a in ("once", "const") if side == "a" else self.b == "const"

    @property
    def batch_inside(self) -> bool:
        """Does the batch loop run inside the A block (`pc, ic, b0, jr, ir`), each packed
        block of A then serving every image?"""
        return any(loop[0] == "b" for loop in self.loops) and self.loops[0][0] != "b"

    def __str__(self) -> str:  # every field, always: the plan is read whole
        return (f"gemm {self.stmt} {self.kernel} m={self.m} n={self.n} k={self.k} "
                f"mc={self.mc} nc={self.nc} kc={self.kc} par={self.par} threads={self.threads} "
                f"loops={','.join(self.loops) or '-'} b={self.b}"
                + (f" a={self.a}" if self.a != "packed" else "")
                + (f" masked={self.masked}" if self.masked != "-" else "")
                + (f" depth={self.depth}" if self.depth != "-" else "")
                + (f" then={self.then}" if self.then else "")
                + (f" then_depth={self.then_depth}" if self.then_depth != "-" else "")
                + (f" row_tile={self.row_tile}" if self.row_tile else "")
                + (f" taps={self.taps}" if self.taps else "")
                + (f" sliced={self.sliced}" if self.sliced else ""))


@dataclass(frozen=True)
class Winograd(Mark):
    """A 3x3 convolution of stride 1 by Winograd's F(2x2, 3x3) or F(4x4, 3x3)
    (`targets/cpu/winograd.py`): its tiles' transforms and 16 or 36 products on a gemm
    kernel, block by block of tile rows."""

    word: ClassVar[str] = "winograd"
    positional: ClassVar[tuple[str, ...]] = ("stmt", "kernel")
    stmt: str = ""
    kernel: str = ""  # the gemm kernel of the (tile + 2)^2 products
    tile: int = 2  # F(tile x tile, 3x3)
    rows: int = 0  # tile rows (`tile` output rows each, over every image) a block
    # 'blocks' (each thread its own blocks) | 'team' (the team shares each block's
    # transforms and products) | 'none'
    par: str = "none"
    threads: int = 0  # 0: the runtime's team
    # 'const': the weights a constant, transformed on the kernel's first call and kept;
    # 'call': transformed on every call
    weights: str = "call"

    @property
    def transforms(self) -> str:  # the registry kernel of its tile's transforms
        return f"winograd_f{self.tile}x3"


@dataclass(frozen=True)
class PackA(Mark):
    word: ClassVar[str] = "pack_a"
    positional: ClassVar[tuple[str, ...]] = ("stmt",)
    stmt: str = ""


@dataclass(frozen=True)
class PackB(Mark):
    word: ClassVar[str] = "pack_b"
    positional: ClassVar[tuple[str, ...]] = ("stmt",)
    stmt: str = ""


@dataclass(frozen=True)
class TeamFor(Mark):
    word: ClassVar[str] = "team_for"
    positional: ClassVar[tuple[str, ...]] = ("stmt",)
    stmt: str = ""


@dataclass(frozen=True)
class BRows(Mark):
    word: ClassVar[str] = "b_rows"
    positional: ClassVar[tuple[str, ...]] = ("stmt",)
    stmt: str = ""


@dataclass(frozen=True)
class Tile(Mark):
    """One tile runs below: the arrays it touches are promoted to `level` here (`name`
    tells apart the tiles of one kernel: a contraction's C block and its K steps)."""

    word: ClassVar[str] = "tile"
    positional: ClassVar[tuple[str, ...]] = ("level", "name")
    level: str = ""
    name: str = "tile"
