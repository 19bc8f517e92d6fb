"""Recognising what a microkernel can compute, from a kernel's statements alone.

`gemm_view` finds a contraction with its init and epilogue,

    C[b.., I.., J..] = init(b, I, J);  C[b, I, J] += f(b, I, K) * g(b, K, J);  E1; E2; ...

where the output's last dims J (its columns) are read by one operand only, the dims I
before them by the other only, and every epilogue statement E is elementwise on C's box,
reading what the kernel produces only at its own point. That covers matmul (batched,
broadcast, transposed), linear, and conv2d as an implicit GEMM (I = output channels,
J = output pixels, K = input channels x kernel window: the gather and its zero padding
are f and g, evaluated when packing). Asked for (`tail=True`, the cpu target), it
also takes row operations after the epilogue, each over C's box or C's box with its
columns reduced, reading what the kernel produces only in its own row (a softmax or a
row sum of C): the view's `tail`; with `then=True` too, a second contraction after the
tail whose A is one of the tail's results (attention's probabilities times v): the
view's `then`. Codegen and the matcher both call it, so the roles are never stored
twice.

`row_view` finds a reduction along a contiguous innermost axis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..kernel import Kernel
from ..kernel.comprehension import (Aff, Call, Const, Expr, FloorDiv, Guarded, Load,
                                           Mod, Statement, first_sum)


def iterators(e) -> set[int]:
    """Iterator positions an expression or index depends on (guards included)."""
    if isinstance(e, Aff):
        return {p for p, _ in e.terms}
    if isinstance(e, (FloorDiv, Mod)):
        return iterators(e.arg)
    if isinstance(e, Load):
        return set().union(*(iterators(x) for x in e.index)) if e.index else set()
    if isinstance(e, Call):
        return set().union(*(iterators(a) for a in e.args)) if e.args else set()
    if isinstance(e, Guarded):
        out = iterators(e.then) | iterators(e.otherwise)
        for b in e.bounds:
            out |= iterators(b.aff)
        return out
    return set()


def loads_of(e: Expr):
    if isinstance(e, Load):
        yield e
    elif isinstance(e, Call):
        for a in e.args:
            yield from loads_of(a)
    elif isinstance(e, Guarded):
        yield from loads_of(e.then)
        yield from loads_of(e.otherwise)


def _pure(index) -> tuple[int, ...] | None:
    """Iterator positions of an index whose every dim is one distinct iterator."""
    out = []
    for e in index:
        if not (isinstance(e, Aff) and e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1):
            return None
        out.append(e.terms[0][0])
    return tuple(out) if len(set(out)) == len(out) else None


def _identity(s: Statement) -> bool:
    return _pure(s.index) == tuple(range(len(s.extents)))


@dataclass(frozen=True)
class GemmView:
    stmt: Statement  # the contraction
    init: Statement
    epilogue: tuple[Statement, ...]  # in program order
    out_iter: tuple[int, ...]  # contraction iterator of each output dim
    batch: tuple[int, ...]  # output dims that are batch dims
    rows: tuple[int, ...]  # output dims flattened into M
    cols: tuple[int, ...]  # output dims flattened into N (the last ones)
    red: tuple[int, ...]  # contraction iterators flattened into K, in order
    a_arg: int  # which operand of the product is the A (rows) side
    shape: tuple[int, ...]  # the output's shape
    # row operations after the epilogue (attention's softmax of the scores), in program
    # order: they read a block of C's rows once every column of it is final
    tail: tuple[Statement, ...] = ()
    # a second contraction after the tail, its A a result of the tail read along C's
    # columns (attention's probabilities times v): it runs on each block of rows too
    # (`_then`)
    then: "GemmView | None" = None

    @property
    def M(self) -> int:
        return math.prod(self.shape[d] for d in self.rows)

    @property
    def N(self) -> int:
        return math.prod(self.shape[d] for d in self.cols)

    @property
    def K(self) -> int:
        return math.prod(self.stmt.extents[p] for p in self.red)

    @property
    def batches(self) -> int:
        return math.prod(self.shape[d] for d in self.batch)

    @property
    def a_expr(self) -> Expr:
        return self.stmt.expr.args[self.a_arg]

    @property
    def b_expr(self) -> Expr:
        return self.stmt.expr.args[1 - self.a_arg]

    def strides(self, dims: tuple[int, ...]) -> dict[int, int]:
        """Output dim -> its weight in the flattened index of `dims` (row-major)."""
        out, w = {}, 1
        for d in reversed(dims):
            out[d] = w
            w *= self.shape[d]
        return out

    def out_name(self, s: Statement, d: int) -> str:
        """The iterator of output dim d in s: the contraction's own, or the dim itself in
        its init and epilogue statements."""
        return s.iter_name(self.out_iter[d] if s is self.stmt else d)

    def block_number(self, s: Statement, mb: int, nb: int) -> str:
        """The index of s's C block of mb x nb in a row-major walk over batch, rows of
        blocks and columns of blocks: one loop in which every block is a core's to take."""
        row, col = self.rows[0], self.cols[0]
        index = "0"
        for d in self.batch:
            index = f"({index}) * {self.shape[d]} + {self.out_name(s, d)}"
        return (f"(({index}) * {math.ceil(self.M / mb)} + floor(({self.out_name(s, row)})/{mb}))"
                f" * {math.ceil(self.N / nb)} + floor(({self.out_name(s, col)})/{nb})")

    def red_strides(self) -> dict[int, int]:
        out, w = {}, 1
        for p in reversed(self.red):
            out[p] = w
            w *= self.stmt.extents[p]
        return out

    @property
    def flops(self) -> int:
        return 2 * self.batches * self.M * self.N * self.K

    @property
    def c_matrix(self) -> bool:
        """Is C, as stored, an M x N row-major matrix per batch point (its columns the
        output's last dims)? Not when batch dims are folded into the columns (`fold`)."""
        return min(self.cols) > max(self.rows)


def gemm_view(kernel: Kernel, tail: bool = False, fold: bool = False,
              then: bool = False) -> GemmView | None:
    """The kernel as one contraction with init and epilogue, or None (see the module
    docstring for the form); with `tail`, also one followed by row operations on C
    (`_row_tail`), which only the cpu target's nest places. With `fold`, the batch dims
    only B reads are columns too (conv2d's images: C[n, o, p] has the columns (n, p),
    so W is one A for all of them); C is then no M x N matrix (`c_matrix`)."""
    return _view(kernel.statements, lambda t: kernel.array(t).type.shape, tail, fold, then)


def _view(statements: list[Statement], shape_of, tail: bool, fold: bool,
          then: bool = False) -> GemmView | None:
    """`gemm_view` of `statements`, `shape_of` giving an array's shape."""
    s = first_sum(statements)
    if s is None:
        return None
    if not (s.dtype == "float32" and isinstance(s.expr, Call) and s.expr.fn == "mul"
            and len(s.expr.args) == 2):
        return None
    out_iter = _pure(s.index)
    if out_iter is None or not out_iter:
        return None
    shape = shape_of(s.target)
    if tuple(s.extents[p] for p in out_iter) != shape:
        return None
    red = tuple(p for p in range(len(s.extents)) if p not in out_iter)
    if not red:
        return None
    f_it, g_it = (iterators(a) for a in s.expr.args)
    last = out_iter[-1]
    if last in g_it and last not in f_it:
        a_arg = 0
    elif last in f_it and last not in g_it:
        a_arg, f_it, g_it = 1, g_it, f_it
    else:
        return None
    t = len(out_iter)
    d = t
    while d > 0 and out_iter[d - 1] in g_it and out_iter[d - 1] not in f_it:
        d -= 1
    cols = tuple(range(d, t))
    r = d
    while r > 0 and out_iter[r - 1] in f_it and out_iter[r - 1] not in g_it:
        r -= 1
    rows = tuple(range(r, d))
    if not rows:
        return None
    batch = tuple(range(r))
    if fold:
        moved = tuple(b for b in batch if out_iter[b] in g_it and out_iter[b] not in f_it
                      and shape[b] > 1)
        batch, cols = tuple(b for b in batch if b not in moved), moved + cols
    # the rest of the kernel: exactly one init before, elementwise epilogue after
    pos = statements.index(s)
    before, after = statements[:pos], statements[pos + 1:]
    if len(before) != 1:
        return None
    init = before[0]
    if not (init.target == s.target and init.reduce is None and init.extents == shape
            and _identity(init)):
        return None
    produced = {s.target}
    if any(x.tensor in produced for x in loads_of(init.expr)) or any(
            x.tensor in produced for x in loads_of(s.expr)):
        return None
    epilogue = 0
    for e in after:
        if e.reduce is not None or e.extents != shape or not _identity(e) or e.target in produced:
            break
        if any(x.tensor in produced and _pure(x.index) != tuple(range(t))
               for x in loads_of(e.expr)):
            break
        produced.add(e.target)
        epilogue += 1
    rest = after[epilogue:]
    view = GemmView(s, init, tuple(after[:epilogue]), out_iter, batch, rows, cols,
                    red, a_arg, shape, tuple(rest))
    if not rest:
        return view
    if not tail:
        return None
    if _row_tail(rest, shape, cols, set(produced)):
        return view
    # the then's init: the last statement from which on the rest is one contraction
    # with its epilogue (attention's exp(scores) times v, times the rows' 1 / sum)
    for start in range(len(rest) - 2, 0, -1) if then else ():
        second = _view(rest[start:], shape_of, False, False)
        if second is not None:
            break
    else:
        return None
    if not _row_tail(rest[:start], shape, cols, produced):
        return None
    view = replace(view, tail=tuple(rest[:start]), then=second)
    return view if _then(view, produced) else None


def _then(view: GemmView, produced: set[str]) -> bool:
    """Can `view.then`, a contraction after the row tail, run on each block of C's rows
    once the tail is done with it? Its A must be one of the tail's results over C's box,
    read at the then's own batch point and row along C's single column dim as K (the
    exponentials of attention's scores, exp(q k^T - max) v); its B must read nothing the
    kernel produces; its result is zero-initialised, and its batch and row dims are C's
    (a batch dim B does not read is one of its rows: v shared by all heads, multi-query
    attention). Its epilogue may read what the tail produced at its own batch point and
    row (the rows' 1 / sum): those rows' tail is done before the then."""
    t = view.then
    tail = {s.target: s for s in view.tail}
    a, b = t.a_expr, t.b_expr
    lead = view.batch + view.rows
    if not (len(view.cols) == 1 and len(view.rows) == 1 and len(t.red) == 1
            and t.batch + t.rows == lead and isinstance(a, Load) and a.tensor in tail
            and t.shape[:len(lead)] == view.shape[:len(lead)] and t.K == view.N
            and isinstance(t.init.expr, Const) and t.init.expr.value == 0
            and t.stmt.target not in produced
            and not any(x.tensor in produced for x in loads_of(b))):
        return False
    for e in t.epilogue:
        if e.target in produced or any(
                x.tensor in produced and [_one(i) for i in x.index[:len(lead)]] != list(lead)
                for x in loads_of(e.expr)):
            return False
    own = [t.out_iter[d] for d in lead] + [t.red[0]]
    return (tail[a.tensor].extents == view.shape
            and [_one(x) for x in a.index] == own)


def _row_tail(tail: list[Statement], shape: tuple[int, ...], cols: tuple[int, ...],
              produced: set[str]) -> bool:
    """Is every statement of `tail` a row operation on the contraction's result: over
    C's box, or C's box with its column dims reduced away (kept as dims of 1), reading
    what the kernel produces only in its own batch point and row (a softmax of C's rows,
    a row sum)? Such statements can run on a block of C's rows once all of its columns
    are final, before the next block (`GemmView.tail`). `produced` grows by their
    targets."""
    t, initialised = len(shape), set()

    def row_index(index, reduced_ok: bool) -> bool:
        return all(_one(x) == d or (reduced_ok and d in cols and x == Aff())
                   for d, x in enumerate(index))

    for e in tail:
        if len(e.extents) != t or any(e.extents[d] != shape[d] for d in range(t) if d not in cols):
            return False
        if e.reduce is None:
            if (e.target in produced or not row_index(e.index, False)
                    or any(e.extents[d] not in (1, shape[d]) for d in cols)):
                return False
            initialised.add(e.target)
        elif e.target not in initialised or not row_index(e.index, True):
            return False
        if not all(row_index(x.index, True) for x in loads_of(e.expr) if x.tensor in produced):
            return False
        produced.add(e.target)
    return True


def masked_columns(view: GemmView, kernel: Kernel) -> int | None:
    """d such that no value the kernel keeps depends on C's element (row r, column c)
    where c > r + d: every read of C, or of an epilogue result computed from C there, is
    in the otherwise branch of a `select` whose condition is `greater` of two iota
    constants or a triangle constant (`graph.ranges`), an affine condition on C's row and
    column (causal attention's mask: d = 0). A tile of C whose every element is so
    masked need not be computed: zeros in its place change nothing. None when that does
    not hold (several row or column dims, a read of C's values outside such a select,
    one kept as an output)."""
    if len(view.rows) != 1 or len(view.cols) != 1:
        return None
    iota = {a.tensor: a.iota for a in kernel.arrays if a.iota is not None}
    triangle = {a.tensor: a.triangle for a in kernel.arrays if a.triangle is not None}
    r, col = view.rows[0], view.cols[0]
    offsets: list[int] = []
    tainted = {view.stmt.target}  # whose values where masked depend on C's there

    def guard_of(cond: Expr) -> Aff | None:
        """The affine expression of the indices that is > 0 where `cond` holds."""
        if isinstance(cond, Load) and cond.tensor in triangle:
            i, j, d = triangle[cond.tensor]
            x, y = cond.index[j], cond.index[i]
            return x + y.scale(-1) + -d if isinstance(x, Aff) and isinstance(y, Aff) else None
        if not (isinstance(cond, Call) and cond.fn == "greater"):
            return None
        a, b = cond.args
        if not (isinstance(a, Load) and isinstance(b, Load) and a.tensor in iota
                and b.tensor in iota):
            return None
        x, y = a.index[iota[a.tensor]], b.index[iota[b.tensor]]
        return x + y.scale(-1) if isinstance(x, Aff) and isinstance(y, Aff) else None

    def unread(e: Expr, guard: Aff | None) -> bool:
        """Are the tainted tensors read in `e` only where `guard` > 0 fails?"""
        if isinstance(e, Load):
            if e.tensor not in tainted:
                return True
            x_r, x_c = e.index[r], e.index[col]
            if guard is None or not (isinstance(x_r, Aff) and isinstance(x_c, Aff)):
                return False
            rest = guard + x_c.scale(-1) + x_r  # guard = (x_c - x_r) + rest
            if rest.terms:
                return False
            offsets.append(-rest.const)  # masked where x_c > x_r - rest
            return True
        if isinstance(e, Call) and e.fn == "select" and guard_of(e.args[0]) is not None:
            cond, then, otherwise = e.args
            return (unread(cond, guard) and unread(then, guard)
                    and unread(otherwise, guard_of(cond)))
        if isinstance(e, Call):
            return all(unread(a, guard) for a in e.args)
        if isinstance(e, Guarded):
            return unread(e.then, guard) and unread(e.otherwise, guard)
        return True

    for s in view.epilogue:  # elementwise on C: a tainted read taints its result
        if not unread(s.expr, None):
            tainted.add(s.target)
    if (not all(unread(s.expr, None) for s in view.tail) or not offsets
            or any(kernel.array(t).role == "out" for t in tainted)):
        return None
    return max(offsets)


def masked_depth(view: GemmView, kernel: Kernel) -> int | None:
    """d such that A's element at C's row r and K index p is 0 wherever p > r + d (a
    softmax of masked scores, `graph.ranges`; its rows NaN where not, which the terms
    left out cannot change): the K steps past r + d add nothing to row r, as long as B
    holds no inf or NaN, which codegen checks once per call. A must be that array read at
    (row, K), B a plain read; None otherwise."""
    if len(view.rows) != 1 or len(view.red) != 1:
        return None
    a, b = view.a_expr, view.b_expr
    if not (isinstance(a, Load) and isinstance(b, Load)):
        return None
    fact = kernel.array(a.tensor).masked
    if fact is None:
        return None
    row, col, d = fact
    if _one(a.index[row]) != view.out_iter[view.rows[0]] or _one(a.index[col]) != view.red[0]:
        return None
    return d


# virtual columns are computed and dropped: B read in place may take at most this many
# times the column tiles of COLUMN_TILE floats (the narrowest gemm kernel's) a packed B
# takes; else it is packed. Zen 3, 3x3 convolutions, 1 thread: 14x14 images (rows of 17
# floats, 235 virtual columns) took 15 tiles for 13: 67 GFLOP/s in place against 75 packed
# (8 images at 2 threads: 84 against 118); with the rows sharing their pad (15 floats, 209
# virtual columns), 14 tiles for 13: 75 against 76 (8 images: 70 against 82, 101
# against 139 at 2 threads), still packed; 28x28 images, 35 tiles for 33 (24 wide): 80
# against 69 (34 for 33 since); 7x7, 4 for 4: alike. A strided window's copy in phases
# too, since whole rows of it are packed by one strided copy each (`_whole_row`): 28x28
# /2, 3x3 to 256, 14 tiles for 13, Sapphire Rapids, in pairs of calls, packed against
# in place: 8 images 0.885x the time at 1 thread, 0.878x at 2, one image 0.91x and
# 0.97x (it had been allowed 1.1: 8 images 67 against 69 GFLOP/s, one 72 against 64);
# 56x56 /2 to 128, 51 tiles for 49, stays in place (packed: 1.01x, 8 images 1.05x)
MAX_TILE_WASTE = 1.07
COLUMN_TILE = 16
# bytes: a B copy over this is made one batch point at a time (`BRows.slices`); under
# it, the whole copy stays in cache and slicing only repeats the offsets (8x512x7x7 to
# 512, 1.3 MB: 3-5% slower sliced; 8x256x28x28 /2, 7.4 MB: 5-17% faster)
SLICED_COPY = 2 << 20


def _one(e) -> int | None:
    """The iterator of an index that is exactly one iterator, else None."""
    if isinstance(e, Aff) and e.const == 0 and len(e.terms) == 1 and e.terms[0][1] == 1:
        return e.terms[0][0]
    return None


def plain_operands(view: GemmView) -> tuple[Load, Load] | None:
    """A's and B's loads when both are plain row-major reads a copy can bring in the
    contraction's layout, A[.., i, k] and B[.., k, j] (one row, one column and one
    reduction iterator; batch dims pinned or broadcast), each read as is or converted by
    a cast (a float16 operand, `graph.storage`); else None."""
    if len(view.rows) != 1 or len(view.cols) != 1 or len(view.red) != 1:
        return None
    i, j, k = view.out_iter[view.rows[0]], view.out_iter[view.cols[0]], view.red[0]
    batch = [view.out_iter[d] for d in view.batch]
    found = []
    for e, (first, second) in ((view.a_expr, (i, k)), (view.b_expr, (k, j))):
        load = e.args[0] if isinstance(e, Call) and e.fn == "cast" else e
        if not isinstance(load, Load) or len(load.index) < 2:
            return None
        if (_one(load.index[-2]), _one(load.index[-1])) != (first, second):
            return None
        if any(not (x == Aff() or _one(x) in batch) for x in load.index[:-2]):
            return None
        found.append(load)
    return found[0], found[1]


def k_row_stride(expr: Expr, own: int, red: tuple[int, ...], red_ext: list[int],
                 shape: tuple[int, ...], batch: set[int]) -> int | None:
    """The stride between the rows (iterator `own`) of an operand that is one plain
    float32 load reading K at unit stride (its K dims flattened, each at its inner
    extents' weight: a row-major A, conv2d's weights O x C x KH x KW), the batch
    iterators aside: a row of a block is then `kc` consecutive floats. None otherwise."""
    if not _plain(expr) or not iterators(expr) <= {own, *red} | batch:
        return None
    coef = _address_weights(expr, shape)
    if not _row_major(coef, red, red_ext):
        return None
    return coef.get(own, 0) if coef.get(own, 0) > 0 else None


def k_col_stride(expr: Expr, own: list[int], own_ext: list[int], red: tuple[int, ...],
                 red_ext: list[int], shape: tuple[int, ...], batch: set[int]) -> int | None:
    """The stride between the K rows of an operand that is one plain float32 load reading
    its columns (iterators `own`, flattened row-major) at unit stride and K (one
    reduction iterator past extent 1) at a fixed stride, the batch iterators aside (a
    row-major B, a 1x1 convolution's image): a K row of a block is then its columns'
    consecutive floats. None otherwise."""
    if not _plain(expr) or not iterators(expr) <= {*own, *red} | batch:
        return None
    coef = _address_weights(expr, shape)
    k = [pos for pos, n in zip(red, red_ext) if n != 1]  # (a symbolic extent is no 1)
    if len(k) != 1 or not _row_major(coef, own, own_ext):
        return None
    stride = coef.get(k[0], 0)
    return stride if type(stride) is int and stride > 0 else None


def flat_along(expr: Expr, dims: list[int], extents: list[int], shape: tuple[int, ...]) -> bool:
    """Is `expr` one plain float32 load whose address steps by one along `dims` flattened
    row-major (a 1x1 stride-1 conv2d's output pixels: the image's rows end to end)?"""
    return _plain(expr) and _row_major(_address_weights(expr, shape), dims, extents)


def _plain(expr: Expr) -> bool:
    return (isinstance(expr, Load) and expr.dtype == "float32"
            and all(isinstance(e, Aff) for e in expr.index))


def _address_weights(load: Load, shape: tuple[int, ...]) -> dict[int, int]:
    """Each iterator's step of the load's row-major address."""
    coef: dict[int, int] = {}
    for d, e in enumerate(load.index):
        for pos, c in e.terms:
            coef[pos] = coef.get(pos, 0) + c * math.prod(shape[d + 1:])
    return coef


def _row_major(coef: dict[int, int], dims, extents) -> bool:
    """Do `dims` step the address by their inner extents' weights (a dim of extent 1
    never steps)?"""
    weight = 1
    for pos, n in reversed(list(zip(dims, extents))):
        if coef.get(pos, 0) != weight and n != 1:  # (no comparison with a symbolic extent)
            return False
        weight *= n
    return True


def a_row_stride(view: GemmView, kernel: Kernel) -> int | None:
    """`k_row_stride` of A, a tensor in memory (not a kernel-local buffer), with one row
    dim: what a tile needs to read A's rows in place (`Gemm.a`)."""
    e = view.a_expr
    if len(view.rows) != 1 or not isinstance(e, Load) or kernel.array(e.tensor).kept is not None:
        return None
    return k_row_stride(e, view.out_iter[view.rows[0]], view.red,
                        [view.stmt.extents[p] for p in view.red],
                        kernel.array(e.tensor).type.shape,
                        {view.out_iter[d] for d in view.batch})


@dataclass(frozen=True)
class BRows:
    """A B operand read in place, K row by K row, instead of packed:

        B[k][v] = P[base(batch) + off(k) + v]

    P is the tensor itself, or a copy of it padded with the guard's value where the
    guard is false (conv2d's zero border), laid out so that each K row of a tile is
    `nr` consecutive floats of P. `v` is the tile's *virtual* column: the output's
    column dims linearised with P's strides rather than the output's (conv2d over a
    56-wide input padded by 1, its rows sharing their pad: v = 57*y + x), so a tile of
    consecutive v is a contiguous run of P; columns whose dims fall outside the output
    (x = 56) are computed and dropped. This is the direct convolution: no im2col.

    A dim the columns walk with a stride s (a strided conv2d: x[.., 2*y + ky, 2*x + kx])
    is split in the copy into its s phases, P[.., ph, q] = x[.., lo + s*q + ph]: each K
    row then reads one phase at unit stride (q = y + ky // 2, phase ky % 2), and off(k)
    takes each phase's K part apart by division (`split`)."""

    tensor: str
    shape: tuple[int, ...]  # P's shape (`layout`)
    lo: tuple[int, ...]  # per tensor dim: P's first index is the tensor's lo
    valid: tuple[tuple[int, int], ...]  # per dim, the tensor's index range P holds
    pad: float  # P elsewhere
    copy: bool  # False: P is the tensor (no guard, nothing out of range, no phases)
    col_weights: tuple[int, ...]  # per column dim of the view: its weight in v
    col_extents: tuple[int, ...]
    red_weights: tuple[tuple[int, int], ...]  # K iterator -> its weight in P's address
    batch_weights: tuple[tuple[int, int], ...]  # output batch dim -> weight
    const: int  # P's address at every iterator 0, but for the split dims' part
    phases: tuple[int, ...]  # per tensor dim: how many phases P splits it into
    # per split dim, off(k)'s part: (its K terms and constant past lo, phases, the
    # phase's weight, the index's weight): r = aff(k) -> (r % s) * wp + (r / s) * wq
    split: tuple[tuple[tuple[tuple[int, int], ...], int, int, int, int], ...]
    # (tensor dim, output batch dim) when every batch dim of more than one point picks a
    # slice of the copy (conv2d's images): the copy is made one slice at a time inside
    # the batch loop, where it stays in cache for the tiles that read it (8 images of
    # 256x28x28 in phases, 7 MiB, made at once went out to memory and came back)
    slices: tuple[tuple[int, int], ...] = ()

    @property
    def layout(self) -> tuple[tuple[int, bool], ...]:
        """P's dims, outermost first, as (tensor dim, whether it is that dim's phase):
        the dims before the first split one, the phases, then the indices within one."""
        n = len(self.lo)
        cut = [d for d, s in enumerate(self.phases) if s > 1]
        first = cut[0] if cut else n
        return (tuple((d, False) for d in range(first)) + tuple((d, True) for d in cut)
                + tuple((d, False) for d in range(first, n)))

    @property
    def width(self) -> int:
        """Virtual columns: one past the largest v of an output column."""
        return 1 + sum(w * (n - 1) for w, n in zip(self.col_weights, self.col_extents))

    @property
    def inner(self) -> int | None:
        """The column dim of weight 1 (the ones after it have extent 1), None when
        every column dim has extent 1."""
        return max((k for k, w in enumerate(self.col_weights) if w), default=None)


def flat_columns_from(view: GemmView, shape_of) -> int:
    """The first column dim from which on the columns are one row-major run in every
    tensor the write-back reads or writes (a convolution's planes: (y, x) is
    y * W + x in C, in its output and in a residual), so that a tile's columns there
    are one flat index: the last dim holds it, the others 0. Not past a dim a guard
    or a non-affine index reads, which needs its own value; the last dim alone at
    least. `shape_of` gives a tensor's shape."""
    cols = view.cols
    exact: set[int] = set()
    accesses = []
    for s in (view.init, *view.epilogue):
        accesses += [(s.target, s.index), *((x.tensor, x.index) for x in loads_of(s.expr))]
        exact |= _guarded(s.expr)
    weights = []
    for tensor, index in accesses:
        shape = shape_of(tensor)
        if not all(isinstance(n, int) for n in (*shape, *view.shape)):
            return len(cols) - 1
        weight = dict.fromkeys(cols, 0)
        for t, x in enumerate(index):
            if not isinstance(x, Aff):
                exact |= iterators(x)
                continue
            for d, c in x.terms:
                if d in weight:
                    weight[d] += c * math.prod(shape[t + 1:])
        weights.append(weight)
    k = len(cols) - 1
    while k > 0 and not exact & set(cols[k - 1:]) and all(
            w[cols[k - 1]] == w[cols[k]] * view.shape[cols[k]] for w in weights):
        k -= 1
    return k


def _guarded(e) -> set[int]:
    """Iterator positions a guard in `e` tests."""
    if isinstance(e, Guarded):
        return ({p for b in e.bounds for p in iterators(b.aff)}
                | _guarded(e.then) | _guarded(e.otherwise))
    if isinstance(e, Call):
        return set().union(*map(_guarded, e.args))
    return set()


def window_taps(view: GemmView, rows: "BRows") -> int:
    """The floats of P between channels where B's K rows are a 3x3 window's nine taps
    over them: K is (channel, 3 window rows, 3 window columns) and the channel moves a
    row by that plane alone, so row p is at (p / 9) * plane + off(p % 9) (the window
    kernel's `b_taps_variant`); 0 where they are not."""
    ext = view.stmt.extents
    if len(view.red) != 3 or ext[view.red[1]] * ext[view.red[2]] != 9:
        return 0
    channel = view.red[0]
    plane = dict(rows.red_weights).get(channel, 0)
    if plane <= 0 or any(p == channel for terms, *_ in rows.split for p, _ in terms):
        return 0
    return plane


def windowed(view: GemmView) -> bool:
    """Does a dim of B's operand move with both a column and a K iterator (conv2d's
    window: x[.., y + ky, x + kx]), so that neighbouring K rows of a tile overlap?"""
    cols = {view.out_iter[d] for d in view.cols}
    red = {p for p in view.red if view.stmt.extents[p] > 1}
    return any(iterators(x) & cols and iterators(x) & red
               for load in loads_of(view.b_expr) for x in load.index)


def _phases(view: GemmView, load: Load) -> list[int]:
    """Per dim of B's load, the phases a copy splits it into: the stride its column
    iterators walk it with, where a K iterator walks it too (a strided window); else 1
    (a 1x1 strided conv2d reads one phase: its planes are small, packing wins)."""
    cols = {view.out_iter[d] for d in view.cols}
    out = []
    for x in load.index:
        c = [k for p, k in x.terms if p in cols]
        window = any(p in view.red and view.stmt.extents[p] > 1 for p, _ in x.terms)
        s = math.gcd(*c) if c and window and all(k > 0 for k in c) else 1
        out.append(s)
    return out


def _slices(view: GemmView, load: Load, copy: bool) -> tuple[tuple[int, int], ...]:
    """`BRows.slices`: each batch dim of more than one point (or a symbol's) indexes one
    dim of the load by itself, and no other; () when any does not (or there is no
    copy)."""
    dims = [d for d in view.batch if view.shape[d] != 1]
    out = []
    for d in dims if copy else ():
        it = view.out_iter[d]
        at = [t for t, x in enumerate(load.index) if it in dict(x.terms)]
        if len(at) != 1 or load.index[at[0]] != Aff(((it, 1),)):
            return ()
        out.append((at[0], d))
    return tuple(out)


def b_rows(view: GemmView, kernel: Kernel, tile: int = COLUMN_TILE,
           waste: float = MAX_TILE_WASTE, sliced: bool | None = None) -> BRows | None:
    """B as rows of a (padded, phase-split) tensor (`_b_rows`). Where its K rows would
    lie a multiple of 1 KiB apart (`_crowded`: power-of-two planes, 32x32 or 64x64),
    they fall into a few of L1's sets and evict each other before the next tile reads
    them again (1x256x64x64 to 64 1x1, when 1x1s were read in place: 28 GFLOP/s,
    1x256x64x65: 69): the copy is then made with its rows a float or more longer, the
    extra columns virtual. `tile`, `waste` and `sliced` as in `_b_rows`."""
    rows = _b_rows(view, kernel, 0, tile, waste, sliced)
    if rows is None or max(rows.phases) > 1 or not _crowded(rows, view):
        return rows
    for extra in range(1, 9):
        wider = _b_rows(view, kernel, extra, tile, waste, sliced)
        if wider is None or not _crowded(wider, view):
            return wider
    return rows


# K rows this many bytes apart (or a multiple) share a few of an L1's sets: 4 KiB a
# way, 64-byte lines, so at most 4 of its 64 sets
CROWDED_STRIDE = 1024


def _crowded(rows: BRows, view: GemmView) -> bool:
    """Does a K iterator of more than 8 steps move B's rows a multiple of
    CROWDED_STRIDE bytes?"""
    ext = view.stmt.extents
    return any(w and ext[p] > 8 and (4 * w) % CROWDED_STRIDE == 0 for p, w in rows.red_weights)


def _b_rows(view: GemmView, kernel: Kernel, extra: int, tile: int,
            waste: float, sliced: bool | None = None) -> BRows | None:
    """B as rows of a (padded, phase-split) tensor, or None when B is anything but one
    load (guarded by bounds on its index dims) whose column dims, once strided dims are
    split into phases, walk memory with unit stride innermost, or when that gains
    nothing: a B without a window (`windowed`) is faster packed. A plain matmul's rows
    are a whole row of B apart (127x255x383 ran at 61 GFLOP/s in place against 80
    packed); a 1x1 convolution's are whole planes apart, each tile touching a few lines
    of every one (Zen 3: 1x1024x14x14 to 256 channels 112 GFLOP/s in place against 145
    packed, 8x512x28x28 to 128 105 against 130). Its 56x56 planes had stayed in place
    while a packed B block filled a share of L3 (Zen 3, 1x256x56x56 to 64: 135 against
    96); with the block in L2 where one thread computes the whole contraction
    (`tiles.model_tiles`' `alone`), packed against in place, Sapphire Rapids, in pairs
    of calls, 1 thread: 1x and 8x256x56x56 to 64 1.12x and 1.19x the speed, 1x and
    8x64x56x56 to 64 1.22x and 1.20x, 8x64x56x56 to 256 1.11x (the 6x16 and 4x24
    kernels, 1.14-1.48x); 2 threads, 8 images 1.06-1.21x, one image (a team sharing
    each block of L3's share) 0.98-1.19x. A layout whose virtual columns take over
    `waste` times the column tiles of `tile` is left to packing too. `extra`: P is a
    copy whose rows are that many floats longer (zeros past the tensor's), whatever the
    guard. `sliced`: is the copy made per batch point (`BRows.slices`)? None: by its
    size (SLICED_COPY); codegen passes the plan's (`Gemm.sliced`), made at the sizes a
    symbolic compile probed, as its own sizes may be a symbol's."""
    if not view.c_matrix or not windowed(view):
        return None
    e = view.b_expr
    bounds, load, pad = (e.bounds, e.then, e.otherwise) if isinstance(e, Guarded) else ((), e, None)
    if pad is not None and not isinstance(pad, Const):
        return None
    if not isinstance(load, Load) or load.dtype != "float32" or not load.index or not all(
            isinstance(x, Aff) for x in load.index):
        return None
    arr = kernel.array(load.tensor)
    if arr.kept is not None or (not bounds and len(view.cols) < 2):
        return None
    S, ext = arr.type.shape, view.stmt.extents
    lo, hi, valid = [], [], []
    for d, x in enumerate(load.index):
        # by the sign of c alone: an extent (at least 1) may be a symbol's (a batch N)
        lo.append(x.const + sum(c * (ext[p] - 1) for p, c in x.terms if c < 0))
        hi.append(x.const + sum(c * (ext[p] - 1) for p, c in x.terms if c > 0))
        valid.append([0, S[d]])
    for b in bounds:
        d = next((d for d, x in enumerate(load.index) if dict(x.terms) == dict(b.aff.terms)
                  and x.terms), None)
        if d is None:
            return None
        shift = b.aff.const - load.index[d].const
        valid[d] = [max(valid[d][0], b.lo - shift), min(valid[d][1], b.hi - shift)]
    phases = _phases(view, load)
    copy = bool(bounds) or max(phases) > 1
    if not copy and any(l < 0 or h >= n for l, h, n in zip(lo, hi, S)):
        return None
    box = tuple(h - l + 1 for l, h in zip(lo, hi)) if copy else S
    if copy and phases[-1] == 1:
        # a row's pad on the right and the next row's on the left are one run of the
        # pad value: the rows share it, a window reading past a row's end reads the
        # next one's left pad (56-wide rows padded by 1: 57 floats a row, not 58, and
        # 3191 virtual columns for 3136, not 3246); no more than leaves a row as wide as
        # the outputs reach along it (a window narrower than its pads: 2 wide, pads of 2)
        reach = 1 + sum(c * (ext[p] - 1) for p, c in load.index[-1].terms if p not in view.red)
        shared = min(valid[-1][0] - lo[-1], hi[-1] + 1 - valid[-1][1], box[-1] - reach)
        box = box[:-1] + (box[-1] - max(0, shared),)
    lo = tuple(lo) if copy else (0,) * len(S)
    if extra:
        copy, box = True, box[:-1] + (box[-1] + extra,)
    rows = BRows(load.tensor, (), lo, tuple(map(tuple, valid)),
                 float(pad.value) if pad is not None else 0.0, copy, (), (), (), (), 0,
                 tuple(phases), ())
    # P's dims and strides, then each iterator's weight in its address
    extent = {(d, True): s for d, s in enumerate(phases)}
    extent.update({(d, False): -(-n // s) for d, (n, s) in enumerate(zip(box, phases))})
    shape = tuple(extent[dim] for dim in rows.layout)
    pstride, w = {}, 1
    for dim in reversed(rows.layout):
        pstride[dim] = w
        w *= extent[dim]
    weight, const, split = {}, 0, []
    for d, x in enumerate(load.index):
        s, wq = phases[d], pstride[(d, False)]
        if s == 1:
            for p, c in x.terms:
                weight[p] = weight.get(p, 0) + c * wq
            const += (x.const - lo[d]) * wq
            continue
        window = tuple((p, c) for p, c in x.terms if p in view.red)
        for p, c in x.terms:
            if p in view.red:
                continue
            if c % s or p not in {view.out_iter[q] for q in view.cols}:
                return None  # a batch iterator in a split dim
            weight[p] = weight.get(p, 0) + c // s * wq
        # the K part past lo is >= 0 (the column terms' coefficients are positive)
        split.append((window, x.const - lo[d], s, pstride[(d, True)], wq))
    col_ext = tuple(view.shape[d] for d in view.cols)
    cols = tuple(weight.get(view.out_iter[d], 0) if n > 1 else 0
                 for d, n in zip(view.cols, col_ext))
    # v's digits must be the column dims: weights a mixed radix (each a multiple of the
    # next one in), the innermost 1, each above the largest v the dims inside reach
    inner, unit = 0, 0
    for w, n in reversed(list(zip(cols, col_ext))):
        if n > 1 and (w <= inner or (unit == 0 and w != 1) or (unit and w % unit)):
            return None
        inner += w * (n - 1)
        unit = w or unit
    rows = replace(rows, shape=shape, col_weights=cols, col_extents=col_ext,
                   red_weights=tuple((p, weight.get(p, 0)) for p in view.red),
                   batch_weights=tuple((d, weight.get(view.out_iter[d], 0)) for d in view.batch),
                   const=const, split=tuple(split))
    if 4 * math.prod(shape) > SLICED_COPY if sliced is None else sliced:
        rows = replace(rows, slices=_slices(view, load, copy))
    if -(-rows.width // tile) > waste * -(-view.N // tile):
        return None
    return rows


@dataclass(frozen=True)
class RowView:
    stmt: Statement  # a reduction whose innermost iterator walks a contiguous row
    load: Load
    axis: int  # the innermost iterator position
    length: int


def row_views(kernel: Kernel) -> list[RowView]:
    """Reductions (sum, max) of float32 whose expression is one load, contiguous along
    the statement's innermost iterator, which only that reduction walks."""
    out = []
    for s in kernel.statements:
        if s.reduce not in ("sum", "max") or s.dtype != "float32" or not isinstance(s.expr, Load):
            continue
        axis = len(s.extents) - 1
        if axis < 0 or axis in iterators_of_index(s.index):
            continue
        load = s.expr
        if not load.index or any(axis in iterators(e) for e in load.index[:-1]):
            continue
        last = load.index[-1]
        if not (isinstance(last, Aff) and dict(last.terms).get(axis) == 1):
            continue
        out.append(RowView(s, load, axis, s.extents[axis]))
    return out


def iterators_of_index(index) -> set[int]:
    return set().union(*(iterators(e) for e in index)) if index else set()
