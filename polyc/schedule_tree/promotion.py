"""Promotion: what one tile touches of an array, copied into a buffer of a faster level.

At a node of a schedule tree, the loops above it fix a tile; the tile's footprint in an
array is the image of the tile's statement instances under the access relation, a map
from the outer loop values to array elements, computed exactly with isl:

    footprint = (prefix schedule)^-1 . access     { [o0, o1] -> x[i, k] : o0 <= i < o0 + 64 ... }

A promotion copies that footprint into a buffer laid out by a layout map before the tile
runs (what it reads) and back after it (what it writes). The box layout (DMA on the
many-core chip, the NPU's buffer copies) keeps each dimension: element e of the tile at
o sits at e - lo(o), where lo(o) is the footprint's smallest index per dimension (an isl
piecewise affine function of the outer values); the buffer's extents are the largest
box over every tile (isl's maximum of hi - lo + 1). The cpu's packed panels lay the box
out in strips of the microkernel's width (`panels`): a column panel of A is [rows / mr]
[k][mr]. The NPU's cube reads fractal matrices (`fractal`): the box's last two dims in
16 x 16 blocks, `layout_map` { [r, c] -> [floor(r/16), floor(c/16), r mod 16, c mod 16] }
of the element's place in the box; the copies convert.

`Promotion` is the record: printable (`--print-after-all`, the report, the browser view)
and what codegen reads for sizes and offsets, whatever the copy becomes (a packing loop,
a DMA transfer, a fractal copy).
"""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl


@dataclass(frozen=True)
class Promotion:
    buffer: str  # the buffer's C name
    array: str  # what is copied: an array's C name, or an operand ("S0.a")
    level: str  # the memory level the buffer lives in
    direction: str  # "in" (read by the tile) | "out" (written by it) | "inout"
    footprint: isl.Map  # [outer loop values] -> the elements one tile touches
    lo: tuple[isl.PwAff, ...]  # per dimension, the tile's first element (of the outer values)
    box: tuple[int, ...]  # the largest footprint box over every tile
    # "box" | "panels <width> <dim>": strips of `width` along `dim` | "fractal <edge>": the
    # last two dims in edge x edge blocks, zero-padded to whole blocks (the NPU's cube)
    layout: str = "box"
    element_bytes: int = 4
    at: str = ""  # the mark whose subtree is the tile (the copies go there)
    pad: tuple[int, ...] = ()  # box: each extent rounded up to a multiple of these
    also: tuple[str, ...] = ()  # arrays held in the same buffer, at the same positions
    # > 0: how many buffers it takes (else the target's default); `stepped`: the tile
    # whose last dim starts at lo is in slot (lo / extent) mod slots (a panel kept in K
    # steps, each its own buffer), else the tiles take the slots in turn
    slots: int = 0
    stepped: bool = False
    # the statements that read and write the array through this buffer, where other
    # promotions of it serve the others (a row's passes, each in steps of its own);
    # empty: every statement below `at`
    statements: tuple[str, ...] = ()

    @property
    def extents(self) -> tuple[int, ...]:
        """The buffer's shape: the box (rounded up to `pad`), or [strips][the other
        dims][width] for panels."""
        if self.layout == "box":
            return tuple(-(-n // m) * m for n, m in zip(self.box, self.pad)) if self.pad else self.box
        if self.layout.startswith("fractal"):
            edge = int(self.layout.split()[1])
            *outer, rows, cols = self.box
            return (*outer, -(-rows // edge), -(-cols // edge), edge, edge)
        _, width, dim = self.layout.split()
        width, dim = int(width), int(dim)
        # a symbolic box (one compile for all sizes) takes an affine bound: a strip's
        # padding is at most width - 1
        strips = (-(-self.box[dim] // width) if type(self.box[dim]) is int
                  else (self.box[dim] + width - 1) / width)
        return (strips,) + tuple(n for d, n in enumerate(self.box) if d != dim) + (width,)

    @property
    def elements(self) -> int:
        n = 1
        for e in self.extents:
            n *= e
        return n

    @property
    def bytes(self) -> int:
        return self.elements * self.element_bytes

    def __str__(self) -> str:
        shape = "x".join(map(str, self.extents))
        lo = ", ".join(" | ".join(_pieces(p)) for p in self.lo)
        also = f" (also holding {', '.join(self.also)}, in place)" if self.also else ""
        placed = f" placed {layout_map(self)}" if self.layout.startswith("fractal") else ""
        if self.slots:
            placed += (" in 1 buffer" if self.slots == 1 else
                       f" in {self.slots} {'steps' if self.stepped else 'slots'}")
        used = f" for {', '.join(self.statements)}" if self.statements else ""
        return (f"promote {self.array} -> {self.buffer} [{self.level}, {self.direction}, "
                f"{self.layout}] {shape} ({self.bytes} B) at ({lo}){also}{placed}{used}")


def layout_map(p: Promotion) -> isl.Map:
    """Where an element of the tile's box sits in the buffer: e - lo (the box), or its
    block and its place in the block (fractal)."""
    n = len(p.box)
    src = ", ".join(f"e{d}" for d in range(n))
    if not p.layout.startswith("fractal"):
        return isl.Map(f"{{ [{src}] -> [{src}] }}")
    edge = int(p.layout.split()[1])
    outer = [f"e{d}" for d in range(n - 2)]
    r, c = f"e{n - 2}", f"e{n - 1}"
    dst = outer + [f"floor({r}/{edge})", f"floor({c}/{edge})", f"{r} mod {edge}",
                   f"{c} mod {edge}"]
    return isl.Map(f"{{ [{src}] -> [{', '.join(dst)}] }}")


def _pieces(pa: isl.PwAff) -> list[str]:
    """The affine expressions of a piecewise one, as text (their domains left out)."""
    out: list[str] = []

    def text(_, aff: isl.Aff) -> None:
        t = str(aff).split("->", 1)[-1].strip().rstrip("}").strip()
        out.append(t[2:-2] if t.startswith("[(") and t.endswith(")]") else t.strip("[]"))

    pa.foreach_piece(text)
    return out


def footprint(node: isl.ScheduleNode, access: isl.UnionMap,
              prefix: isl.UnionMap | None = None) -> isl.Map:
    """The elements one tile of the loops above `node` touches through `access` (one
    array's accesses of the statements below `node`), by the outer loop values.
    `prefix`: `tile_prefix(node)`, where the caller asks about many arrays."""
    prefix = tile_prefix(node) if prefix is None else prefix
    access = access.intersect_domain(node.get_domain())
    touched = prefix.intersect_domain(access.domain()).reverse().apply_range(access)
    maps: list[isl.Map] = []
    touched.foreach_map(maps.append)
    if len(maps) != 1:
        raise ValueError(f"a footprint of one array, not {len(maps)}")
    return maps[0].coalesce()


def box(fp: isl.Map) -> tuple[tuple[isl.PwAff, ...], tuple[int, ...]]:
    """Per dimension, the first element of each tile's footprint (of the outer values)
    and the largest extent over every tile."""
    n = fp.dim(isl.dim_type.out)
    lo = tuple(fp.dim_min(d).coalesce() for d in range(n))
    extents = []
    for d in range(n):
        try:
            span = fp.dim_max(d).sub(lo[d]).max_val()
        except isl.Error:  # a quasi-affine span (reshape's divisions): all tiles together
            whole = fp.range()
            span = whole.dim_max_val(d).sub(whole.dim_min_val(d))
        if not span.is_int():
            raise ValueError(f"the footprint {fp} is unbounded along dimension {d}")
        extents.append(span.to_python() + 1)
    return lo, tuple(extents)


def tile_prefix(node: isl.ScheduleNode) -> isl.UnionMap:
    """Each statement instance below `node` -> the outer loop values of its tile."""
    return node.get_prefix_schedule_union_map().intersect_domain(node.get_domain())


def promote(node: isl.ScheduleNode, access: isl.UnionMap, *, buffer: str, array: str,
            level: str, direction: str, layout: str = "box", element_bytes: int = 4,
            at: str = "", pad: tuple[int, ...] = (),
            prefix: isl.UnionMap | None = None) -> Promotion:
    """The promotion of what `access` touches below `node` (see the module docstring;
    `prefix` as for `footprint`)."""
    fp = footprint(node, access, prefix)
    lo, extents = box(fp)
    return Promotion(buffer, array, level, direction, fp, lo, extents, layout, element_bytes,
                     at, pad)


def find(schedule: isl.Schedule, mark: str) -> isl.ScheduleNode:
    """The node right below the mark whose text is `mark`."""
    found: list[isl.ScheduleNode] = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.mark and node.mark_get_id().get_name() == mark:
            found.append(node.child(0))
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    if not found:
        raise KeyError(mark)
    return found[0]
