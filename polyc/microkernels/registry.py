"""The microkernel registry: every hand-written kernel described as data.

Each entry names its C file (one kernel per file, its contract in the file's header
comment), the tile it computes, the layout its operands must be packed in, its alignment
and the target features it needs. The matcher reads the registry to pick a kernel and
its tile shape; codegen pastes the chosen files (include-guarded) into the translation
unit, except the cpu's gemm kernels, which it links prebuilt (`unit_source`); the
browser view can show `to_json()`.

A target's features are those gcc enables for its `-march` (the flags the generated code
is built with, `target.features`), so a kernel is only chosen where it compiles and runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..machine import Machine

HERE = Path(__file__).resolve().parent
# entries of a b_rows kernel's `off` past its kc: it fetches rows that far ahead with no
# test of the step (the caller fills them with offsets into B)
B_ROWS_AHEAD = 16


@dataclass(frozen=True)
class Microkernel:
    name: str  # registry name; the C function is `polyc_<name>`
    kind: str  # 'gemm' | 'row_sum' | 'row_max' | 'row_maxsumexp'
    dtype: str
    file: str  # C source beside this module
    features: tuple[str, ...]  # target features it needs (gcc's -m flags, without -m)
    mr: int = 1  # gemm: rows of C per call
    nr: int = 1  # gemm: columns of C per call
    alignment: int = 32  # bytes, of packed operands
    layouts: tuple[tuple[str, str], ...] = ()  # operand -> layout it must be packed in
    writes: str = ""  # overwrite / accumulate contract of the result
    needs: tuple[str, ...] = ()  # other C files pasted before this one
    rank: int = 0  # among kernels of one kind whose features a target has, higher wins
    rows_variant: str = ""  # gemm: C function computing only a tile's first rows x cols
    # gemm: C function reading B in place, row p at B + off[p] (off: kc + B_ROWS_AHEAD)
    b_rows_variant: str = ""
    # gemm: C function reading A in place, row r at A + r * lda, on a tile's first rows x cols
    a_rows_variant: str = ""
    target: str = "cpu"  # the target whose code calls it
    # a kernel built once as a prebuilt part (a row kernel, Winograd's transforms): its
    # entries' C prototypes, ';'-separated (one that calls the codegen prelude's
    # functions, polyc_expf, is pasted into each unit)
    entry: str = ""
    # gemm: made for a convolution's window read in place (B broadcast, C's rows made by
    # a transpose in registers): `choose` never picks it, the cpu plan does for such a B
    # (`window_kernel`)
    window: bool = False
    # gemm: as b_rows_variant on a 3x3 window, K row p at B + (p / 9) * plane +
    # off[p % 9], in two runs of nr / 2 `step` floats apart (two output rows of nr / 2
    # pixels), on the first `cols` columns
    b_taps_variant: str = ""
    # gemm: the columns a right-edge tile of full rows costs in steps of (its vector
    # width), where it computes only the vectors it stores and a column of vectors still
    # has independent FMA chains enough to cover their latency (avx512: 8 or 14 rows);
    # 0: the whole tile (avx2 6x16's one vector has 6: on Zen 3 the 4x24 ran 5.7-18%
    # faster over 209 virtual columns, 216 of 6x16's vectors or 4x24's tiles)
    edge_cols: int = 0

    @property
    def c_function(self) -> str:
        return f"polyc_{self.name}"

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype, "file": self.file,
                "c_function": self.c_function, "features": list(self.features),
                "tile": [self.mr, self.nr], "alignment": self.alignment,
                "layouts": dict(self.layouts), "writes": self.writes, "needs": list(self.needs),
                "rows_variant": self.rows_variant, "b_rows_variant": self.b_rows_variant,
                "a_rows_variant": self.a_rows_variant, "window": self.window,
                "b_taps_variant": self.b_taps_variant, "edge_cols": self.edge_cols,
                "target": self.target}


def _gemm(name: str, file: str, features: tuple[str, ...], mr: int, nr: int, alignment: int,
          rank: int, rows_variant: str = "", b_rows_variant: str = "",
          needs: tuple[str, ...] = (), a_rows_variant: str = "",
          window: bool = False,
          b_taps_variant: str = "", edge_cols: int = 0) -> Microkernel:
    return Microkernel(
        name, "gemm", "float32", file, features, mr, nr, alignment, rows_variant=rows_variant,
        b_rows_variant=b_rows_variant, a_rows_variant=a_rows_variant,
        window=window,
        b_taps_variant=b_taps_variant, edge_cols=edge_cols,
        layouts=(("A", f"column panel {mr} x kc: A[p*{mr} + r], zero rows past the edge"),
                 ("B", f"row panel kc x {nr}: B[p*{nr} + c], zero columns past the edge"),
                 ("C", f"row-major {mr} x {nr} tile C[r*ldc + c], every entry written")),
        writes="accumulate=0: C = A B; accumulate=1: C += A B",
        needs=("support.c", *needs), rank=rank)


def _winograd(m: int) -> Microkernel:
    """The transforms of Winograd's F(m x m, 3x3) (targets/cpu/winograd.py): the
    products between them run on a gemm kernel, its A and B the transforms' output."""
    name, e = f"winograd_f{m}x3", (m + 2) ** 2
    return Microkernel(
        name, "winograd", "float32", f"{name}.c", (),
        layouts=(("w", "row-major O x C x 3 x 3"), ("x", "row-major N x C x H x W"),
                 ("U", f"{e} gemm A operands, column panels of the gemm kernel's mr"),
                 ("V", f"{e} gemm B operands, row panels of its nr")),
        writes=f"U, V and {m} output rows a channel (see the file)",
        needs=("winograd_common.c",),
        entry=f"void polyc_{name}_weights(const float *restrict w, long O, long C, long mr, "
              "long es, float *restrict U); "
              f"void polyc_{name}_input(const float *restrict x, long C, long H, long W, "
              "long pt, long pl, long TY, long TX, long r0, long r1, long c0, long c1, "
              "long nr, long cols, long es, float *restrict V, float *restrict strip); "
              f"void polyc_{name}_output(const float *restrict m, long es, long cols, "
              "float *restrict y)")


def _row(kind: str, file: str, writes: str, entry: str = "") -> Microkernel:
    return Microkernel(kind + "_f32", kind, "float32", file, (), 1, 32, 1,
                       layouts=(("x", "one contiguous row, unit stride, any alignment"),),
                       writes=writes, entry=entry)


REGISTRY: tuple[Microkernel, ...] = (
    # one code (sgemm_avx512.c) on two tiles: 14 x 32 wastes least on most shapes, 8 x 48
    # on channel counts (conv2d's M), multiples of 8 that 14 never divides
    _gemm("sgemm_avx512_14x32", "sgemm_avx512_14x32.c", ("avx512f",), 14, 32, 64, rank=3,
          rows_variant="polyc_sgemm_avx512_14x32_rows",
          b_rows_variant="polyc_sgemm_avx512_14x32_b_rows", needs=("sgemm_avx512.c",),
          a_rows_variant="polyc_sgemm_avx512_14x32_a_rows", edge_cols=16),
    _gemm("sgemm_avx512_8x48", "sgemm_avx512_8x48.c", ("avx512f",), 8, 48, 64, rank=3,
          rows_variant="polyc_sgemm_avx512_8x48_rows",
          b_rows_variant="polyc_sgemm_avx512_8x48_b_rows", needs=("sgemm_avx512.c",),
          a_rows_variant="polyc_sgemm_avx512_8x48_a_rows", edge_cols=16),
    # the weights as vectors, a window's pixels broadcast: conv2d's window read in place;
    # two ways to broadcast, which cores rank differently (`plan.window_kernel`); C's
    # rows stored by 128-bit masked stores (avx512vl: every AVX-512 core but Xeon Phi's)
    *(_gemm(name, f"{name}.c", ("avx512f", "avx512vl"), 32, 14, 64, rank=3,
            rows_variant=f"polyc_{name}_rows", b_rows_variant=f"polyc_{name}_b_rows",
            needs=("sgemm_avx512_window.c",), window=True,
            b_taps_variant=f"polyc_{name}_b_taps9")
      for name in ("sgemm_avx512_32x14", "sgemm_avx512_32x14_bcast")),
    _gemm("sgemm_avx2_6x16", "sgemm_avx2_6x16.c", ("avx2", "fma"), 6, 16, 32, rank=2,
          rows_variant="polyc_sgemm_avx2_6x16_rows",
          b_rows_variant="polyc_sgemm_avx2_6x16_b_rows",
          a_rows_variant="polyc_sgemm_avx2_6x16_a_rows"),
    _gemm("sgemm_avx2_4x24", "sgemm_avx2_4x24.c", ("avx2", "fma"), 4, 24, 32, rank=2,
          rows_variant="polyc_sgemm_avx2_4x24_rows",
          b_rows_variant="polyc_sgemm_avx2_4x24_b_rows",
          a_rows_variant="polyc_sgemm_avx2_4x24_a_rows"),
    _gemm("sgemm_vec_6x16", "sgemm_vec_6x16.c", (), 6, 16, 32, rank=1,
          b_rows_variant="polyc_sgemm_vec_6x16_b_rows",
          a_rows_variant="polyc_sgemm_vec_6x16_a_rows"),
    _row("row_sum", "row_sum_f32.c", "returns the sum; the caller adds it to its accumulator",
         "float polyc_row_sum_f32(const float *restrict x, long n)"),
    _row("row_max", "row_max_f32.c", "returns the max (NaN wins); the caller folds it in",
         "float polyc_row_max_f32(const float *restrict x, long n)"),
    _row("row_maxsumexp", "row_maxsumexp_f32.c",
         "writes max and sum(exp(x - max)) through two pointers"),
    _winograd(2),
    _winograd(4),
    Microkernel("mc_sgemm_64x64x32", "gemm", "float32", "mc_sgemm_64x64x32.c", ("sw_cpe",),
                64, 64, 64, (("A", "row-major 64 x 32 in LDM, lda floats a row, zero padded"),
                             ("B", "row-major 32 x 64 in LDM, ldb floats a row, zero padded"),
                             ("C", "row-major 64 x 64 in LDM, ldc floats a row")),
                "C += A B, always whole", (), target="manycore"),
)

ISAS = {"avx512": ("sgemm_avx512_14x32", "sgemm_avx512_8x48", "sgemm_avx512_32x14",
                   "sgemm_avx512_32x14_bcast"), "avx2": ("sgemm_avx2_6x16", "sgemm_avx2_4x24"),
        "portable": ("sgemm_vec_6x16",)}


def by_name(name: str) -> Microkernel:
    return next(m for m in REGISTRY if m.name == name)


def target_features(target: Machine) -> frozenset[str]:
    return target.features


def tile_efficiency(m: Microkernel, rows: int, cols: int) -> float:
    """The share of a gemm kernel's multiply-adds that land inside a rows x cols C: its
    last row tile counted whole, its last column tile in steps of `edge_cols` where it
    computes only the vectors it stores. Counted whole, 196 columns (a 14x14 image)
    ranked 14x32 over 8x48 (224 against 240 computed; 208 and 208 in vectors of 16),
    which ran 0.92x the 8x48's speed on 1x512x28x28 to 1024 1x1 /2 (Zen 5, 1 thread, in
    pairs of calls), as on 256-column blocks (0.91x) and 7x7 images (0.92x)."""
    step = m.edge_cols or m.nr
    return rows / (-(-rows // m.mr) * m.mr) * cols / (-(-cols // step) * step)


TIE = 0.03  # relative: rounds of the calibration differ by about this much


def select(kind: str, dtype: str, target: Machine, isa: str = "",
           shape: tuple[int, int] | None = None,
           rates: dict[str, float] | None = None, streaming: bool = False) -> Microkernel | None:
    """The kernel `choose` picks (see there)."""
    return choose(kind, dtype, target, isa, shape, rates, streaming)[0]


def choose(kind: str, dtype: str, target: Machine, isa: str = "",
           shape: tuple[int, int] | None = None,
           rates: dict[str, float] | None = None,
           streaming: bool = False, windows: bool = False) -> tuple[Microkernel | None, str]:
    """The fastest kernel of `kind` for `dtype` whose features the target has, and why.

    `isa` ('avx512' | 'avx2' | 'portable') asks for one gemm variant (None if the target
    lacks it). Among several gemm kernels, each kernel's speed measured on this host
    (`rates`, from the backend's calibration: with `streaming`, its rates where B's
    micro-panels stream from L2, `plan.streams_b`) is weighed by the share of its
    multiply-adds that land inside a C of `shape` (rows, cols, `tile_efficiency`): 64
    rows waste a third of the 6 x 16 kernel's last row tile and none of the 4 x 24's.
    Scores within TIE of the best are a tie (measurement noise must not flip the
    choice), won by rank (the kernel with edge variants), then the smaller waste, then
    the taller tile. A target this host cannot run keeps the registry's rank (widest ISA
    first). A kernel made for a window read in place (`Microkernel.window`) is not among
    them, unless `windows` (its packed entry, on a narrow C: `plan.choose_gemm_kernel`)."""
    fits = [m for m in REGISTRY if m.kind == kind and m.dtype == dtype
            and (windows or not m.window) and set(m.features) <= target_features(target)]
    if isa and kind == "gemm":
        fits = [m for m in fits if m.name in ISAS.get(isa, ())]
    if len(fits) <= 1 or kind != "gemm":
        best = max(fits, key=lambda m: m.rank, default=None)
        return best, (f"{best.name}: the only {kind} kernel for this target" if best else "")
    rates = rates or {}
    def efficiency(m: Microkernel) -> float:
        return round(tile_efficiency(m, *shape), 3) if shape else 1.0

    if not all(m.name in rates for m in fits):
        best = max(fits, key=lambda m: (m.rank, efficiency(m), m.mr))
        return best, (f"{best.name}: by rank (the kernels were not measured on this host: "
                      f"it cannot run -march={target.arch} code)")
    score = {m.name: rates[m.name] * efficiency(m) for m in fits}
    top = max(score.values())
    scored = sorted(fits, key=lambda m: (score[m.name] >= (1 - TIE) * top, m.rank,
                                         efficiency(m), m.mr, score[m.name]), reverse=True)

    def text(m: Microkernel) -> str:
        return f"{m.name} {rates[m.name]:.1f} GFLOP/s x {efficiency(m):.0%} of its tiles used"

    where = (" in deep K blocks" if windows else
             " with B's panels streaming from L2" if streaming else "")
    return scored[0], (f"measured on this host{where}: " + text(scored[0])
                       + "".join(f"; vs {text(m)}" for m in scored[1:]))


def _files(kernels: list[Microkernel]) -> list[str]:
    """The C files of `kernels` and what they need, each once, dependencies first."""
    order: list[str] = []
    for m in kernels:
        for file in (*m.needs, m.file):
            if file not in order:
                order.append(file)
    return order


def _text(files: list[str]) -> str:
    return "\n".join((HERE / f).read_text() for f in files)


def c_source(kernels: list[Microkernel]) -> str:
    """The C of `kernels` and what they need, each file once, dependencies first.
    Every file is include-guarded, so kernels pasted by two functions do not clash."""
    return _text(_files(kernels))


# the scratch and packing helpers the generated code calls itself
SUPPORT = "support.c"
SUPPORT_PART = "support"  # its name as a prebuilt part
_ENTRY_ARGS = "long kc, const float *restrict A, const float *restrict B, "
_C_ARGS = "float *restrict C, long ldc, int accumulate"
_HIDDEN = '__attribute__((visibility("hidden")))'
_SUPPORT_PROTOTYPES = (
    "#include <stddef.h>\n"
    f"{_HIDDEN} void *polyc_scratch(int slot, size_t bytes);\n"
    f"{_HIDDEN} void polyc_pack_rows_t(const float *restrict src, long ld, long rows, "
    "long tile, long kc, float *restrict dst);\n"
    f"{_HIDDEN} void polyc_pack_cols(const float *restrict src, long ld, long kc, long width, "
    "long valid, long tile, float *restrict dst);")


def prebuilt(m: Microkernel) -> bool:
    """A cpu gemm kernel is compiled once per toolchain and linked (codegen/build.py):
    its row-count instantiations cost more gcc time than most kernels that call it. So
    is a kernel with an `entry`: pasted, row_max was a fifth of a softmax's gcc time, and
    Winograd's transforms half a convolution's."""
    return m.target == "cpu" and (m.kind == "gemm" or bool(m.entry))


def prototypes(m: Microkernel) -> str:
    if m.entry:
        return "\n".join(f"{_HIDDEN} {e.strip()};" for e in m.entry.split(";"))
    lines = [f"{_HIDDEN} void {m.c_function}({_ENTRY_ARGS}{_C_ARGS});"]
    if m.rows_variant:
        lines.append(f"{_HIDDEN} void {m.rows_variant}({_ENTRY_ARGS}{_C_ARGS}, long rows, "
                     "long cols);")
    if m.b_rows_variant:
        lines.append(f"{_HIDDEN} void {m.b_rows_variant}({_ENTRY_ARGS}"
                     f"const long *restrict off, {_C_ARGS});")
    if m.b_taps_variant:
        lines.append(f"{_HIDDEN} void {m.b_taps_variant}({_ENTRY_ARGS}const long *restrict off, "
                     f"long plane, long step, {_C_ARGS}, long cols);")
    if m.a_rows_variant:
        lines.append(f"{_HIDDEN} void {m.a_rows_variant}(long kc, const float *restrict A, "
                     f"long lda, const float *restrict B, {_C_ARGS}, long rows, long cols);")
    return "\n".join(lines)


def _linked(name: str, prototypes: str, text: str) -> str:
    return f"/* polyc link: {name} */\n#ifdef POLYC_PREBUILT\n{prototypes}\n#else\n{text}\n#endif"


def unit_source(kernels: list[Microkernel]) -> str:
    """The C a generated unit carries for `kernels`. A prebuilt kernel is named on a
    `polyc link` line: built with POLYC_PREBUILT the unit sees only its prototypes and
    links the part (`part_source`); built alone it pastes the kernel, so the unit a
    user downloads still compiles by itself. The support the code around a prebuilt
    kernel calls is linked the same way, as a part of its own."""
    pasted = [m for m in kernels if not prebuilt(m)]
    files = _files(pasted)
    out = [_text(files)]
    if any(prebuilt(m) and SUPPORT in m.needs for m in kernels) and SUPPORT not in files:
        out.insert(0, _linked(SUPPORT_PART, _SUPPORT_PROTOTYPES, _text([SUPPORT])))
        files.append(SUPPORT)
    for m in kernels:
        if prebuilt(m):
            own = [f for f in _files([m]) if f not in files]
            files += own
            out.append(_linked(m.name, prototypes(m), _text(own)))
    return "\n".join(out)


def part_source(m: Microkernel) -> str:
    """The C of the prebuilt part of `m`: the kernel with visible (hidden) entry points,
    followed by the prototypes units see, so gcc checks those against the definitions."""
    return (f"#define POLYC_MK_ENTRY __attribute__((noinline)) {_HIDDEN}\n"
            f"#define POLYC_PART_ENTRY {_HIDDEN}\n" + c_source([m]) + "\n" + prototypes(m) + "\n")


def support_part_source() -> str:
    """The C of the support's prebuilt part, followed by the prototypes units see, so
    gcc checks those against the definitions."""
    return f"#define POLYC_SUPPORT_ENTRY {_HIDDEN}\n{_text([SUPPORT])}\n{_SUPPORT_PROTOTYPES}\n"


def prebuilt_parts(features: frozenset[str] | set[str]) -> tuple[tuple[str, str], ...]:
    """(name, C) of every prebuilt kernel a target with `features` can build, and of the
    support their callers link."""
    return ((SUPPORT_PART, support_part_source()),
            *((m.name, part_source(m)) for m in REGISTRY
              if prebuilt(m) and set(m.features) <= set(features)))
