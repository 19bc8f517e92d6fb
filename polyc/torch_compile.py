"""polyc as a torch.compile backend: `torch.compile(fn, backend=polyc.torch_backend)`.

(Above the compiler in the package's layers: it compiles; the conversion of ATen graphs
is a front end, `frontends/torch_convert.py` and `frontends/torch_ops.py`.)

    Dynamo's FX graph -> AOTAutograd (ATen ops; a backward graph too when training)
      -> partition: the largest connected sets of nodes polyc supports (`torch_ops`),
         by torch.fx's CapabilityBasedPartitioner; the rest stays with PyTorch eager
      -> each partition becomes a `PolycSubgraph` module called in its place, which
         compiles it once per input shapes and dtypes (the first call with new shapes
         runs it eagerly once, to learn every node's shape) and then calls the kernels
         on the tensors' memory: contiguous CPU tensors' data addresses go straight to
         them (`Program.run_at`), outputs are `torch.empty` tensors they write into.

With `torch.compile(..., dynamic=True)` Dynamo traces dynamic dims as SymInts: a
partition whose inputs have them is compiled once, with each such dim a polyc symbol
(`torch_convert.to_graph(dynamic=True)`), and every call binds the symbols from its
tensors' shapes. Where polyc cannot write the partition with symbols (a slice along a
dynamic dim, a scalar computed from a size), or a call breaks what the symbolic graph
assumed, the partition is compiled per shape as above, with a warning saying why.

A partition polyc refuses for some shapes (a `PolycError`: an op it cannot express for
them) runs in PyTorch for those shapes, with a warning saying why; `partitions` on the
backend lists every partition with what it compiled and what it refused.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

try:
    import torch
    import torch.fx as fx
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
except ImportError as e:  # polyc itself does not need torch
    raise ImportError("polyc.torch_backend needs PyTorch: pip install torch") from e

from .compiler import compile as compile_graph
from .errors import GraphError, PolycError
from .frontends import torch_convert, torch_ops  # noqa: F401 (torch_ops: the handlers)

PREFIX = "polyc_"


@dataclass(frozen=True)
class _Kernels:
    """A partition compiled for one set of input shapes."""

    compiled: Any  # polyc.compiler.CompiledGraph
    inputs: tuple[tuple[int, str], ...]  # (argument position, polyc input name)
    outputs: tuple[tuple[str, tuple[int, ...]], ...]  # per result: polyc tensor, permutation
    # per polyc output: its shape and dtype; None for a symbolic compile, whose program
    # allocates the outputs at the shapes a call's symbols give
    results: Mapping[str, tuple[tuple[int, ...], torch.dtype]] | None
    # a polyc program reuses its intermediate buffers: one call at a time
    lock: threading.Lock = field(default_factory=threading.Lock)


class PolycSubgraph(torch.nn.Module):
    """One partition: compiled by polyc per input shapes and dtypes, run on the callers'
    tensors. `module` is the partition in ATen ops (what runs when polyc refuses)."""

    def __init__(self, name: str, module: fx.GraphModule, target: str,
                 options: Mapping[str, Any] | None):
        super().__init__()
        self.name, self.module, self.target, self.options = name, module, target, options
        self.ops = [str(n.target) for n in module.graph.nodes if n.op == "call_function"]
        self.kernels: dict[tuple, _Kernels] = {}
        self.refused: dict[tuple, str] = {}  # shapes -> why polyc refused them
        # a partition Dynamo traced with dynamic dims: compiled once for every size
        self.dynamic = any(isinstance(d, torch.SymInt) for n in module.graph.nodes
                           if n.op == "placeholder"
                           for d in getattr(n.meta.get("val"), "shape", ()))
        self.symbolic: _Kernels | None = None
        self.symbolic_refused = ""  # why the partition is not compiled symbolically

    def forward(self, *args):
        if self.dynamic and not self.symbolic_refused:
            kernels = self.symbolic or self._compile_symbolic(args)
            if kernels is not None:
                try:
                    return _run(kernels, args)
                except GraphError as e:  # this call breaks an assumption: per shape
                    warnings.warn(f"polyc.torch_backend: partition {self.name} is compiled "
                                  f"for these shapes: {e}", stacklevel=2)
        key = tuple((a.shape, a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        kernels = self.kernels.get(key)
        if kernels is None and key not in self.refused:
            kernels = self._compile(key, args)
        if kernels is None:
            return self.module(*args)
        return _run(kernels, args)

    def _compile(self, key: tuple, args: tuple) -> _Kernels | None:
        try:
            kernels = self._kernels(args, dynamic=False)
        except PolycError as e:
            self.refused[key] = str(e)
            warnings.warn(f"polyc.torch_backend: partition {self.name} ({', '.join(self.ops)}) "
                          f"runs in PyTorch for these shapes: {e}", stacklevel=2)
            return None
        self.kernels[key] = kernels
        return kernels

    def _compile_symbolic(self, args: tuple) -> _Kernels | None:
        try:
            self.symbolic = self._kernels(args, dynamic=True)
        except PolycError as e:
            self.symbolic_refused = str(e)
            warnings.warn(f"polyc.torch_backend: partition {self.name} ({', '.join(self.ops)}) "
                          f"is compiled per shape, not once for its dynamic dims: {e}",
                          stacklevel=3)
        return self.symbolic

    def _kernels(self, args: tuple, *, dynamic: bool) -> _Kernels:
        """The partition compiled: for these arguments' shapes, or (`dynamic`) once
        for every value of its dynamic dims. A PolycError when polyc refuses it."""
        # one eager run gives every node's value, so every shape is concrete
        interpreter = fx.Interpreter(self.module, garbage_collect_values=False)
        with torch.no_grad():
            interpreter.run(*args)
        values = interpreter.env
        graph, outputs = torch_convert.to_graph(self.module, values, dynamic=dynamic)
        compiled = compile_graph(graph, self.target, options=self.options)
        placeholders = [n for n in self.module.graph.nodes if n.op == "placeholder"]
        inputs = tuple((i, name) for i, n in enumerate(placeholders)
                       if isinstance(name := _input_name(graph, n), str))
        results = None if dynamic else {
            name: (compiled.graph.types[name].shape, _torch_dtype(compiled.graph.types[name].dtype))
            for name in graph.outputs}
        return _Kernels(compiled, inputs, tuple((n, tuple(p)) for n, p in outputs), results)


def _input_name(graph, node: fx.Node) -> str | None:
    name = torch_convert.safe_name(node.name)
    return name if any(t.name == name for t in graph.inputs) else None


def _torch_dtype(name: str) -> torch.dtype:
    return next(t for t, n in torch_convert.DTYPES.items() if n == name)


def _array(t: torch.Tensor):
    # shares the tensor's memory; only a strided view is copied into a dense block
    t = t.detach()
    return _numpy(t if t.is_contiguous() else t.contiguous())


def _numpy(t: torch.Tensor):
    """numpy's view of contiguous `t`'s memory; a bfloat16 tensor (which `Tensor.numpy`
    refuses) through its bits, as ml_dtypes' bfloat16."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("bfloat16")
    return t.numpy()


def _tensor(a):
    """The tensor sharing numpy array `a`'s memory (`_numpy`'s inverse)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(a)


def _run(kernels: _Kernels, args: tuple) -> tuple:
    if kernels.results is None:  # symbolic: the program sizes the outputs (shared, no copy)
        arrays = {name: _array(args[i]) for i, name in kernels.inputs}
        with kernels.lock:
            results = {name: _tensor(a)
                       for name, a in kernels.compiled.program(arrays).items()}
    else:
        results = {name: torch.empty(shape, dtype=dtype)
                   for name, (shape, dtype) in kernels.results.items()}
        # the call's shapes and dtypes are the compile's (its key): the kernels take the
        # tensors' memory as it is (a strided one copied dense first), microseconds a
        # call less than through numpy's views
        dense = {name: args[i] if args[i].is_contiguous() else args[i].contiguous()
                 for i, name in kernels.inputs}
        at = {name: t.data_ptr() for name, t in results.items()}
        at.update((name, t.data_ptr()) for name, t in dense.items())
        with kernels.lock:
            if not kernels.compiled.program.run_at(at):  # a simulated chip's program
                kernels.compiled.program({name: _numpy(t.detach()) for name, t in dense.items()},
                                         {name: _numpy(t) for name, t in results.items()})
    out, seen = [], set()
    for name, perm in kernels.outputs:  # a result returned twice is two tensors, as in eager
        t = results[name].clone() if name in seen else results[name]
        out.append(t if perm == tuple(range(t.dim())) else t.permute(perm))
        seen.add(name)
    return tuple(out)


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        return torch_convert.supported(node)


def partition_graph(gm: fx.GraphModule,
                    make: Callable[[str, fx.GraphModule], torch.nn.Module]) -> fx.GraphModule:
    """`gm` with each largest supported set of nodes (that computes something: views
    alone are free in PyTorch) replaced by a call of `make(name, partition)`."""
    partitioner = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True)
    partitions = [p.nodes for p in partitioner.propose_partitions()
                  if not all(torch_convert.is_view(n) for n in p.nodes)]
    if not partitions:
        return gm
    fused = fuse_by_partitions(gm, partitions, prefix=PREFIX, always_return_tuple=True)
    for name, sub in list(fused.named_children()):
        if name.startswith(PREFIX):
            setattr(fused, name, make(name, sub))
    fused.recompile()
    return fused


class TorchBackend:
    """A torch.compile backend compiling for `target` with `options` (those of
    `polyc.compile`). `partitions` lists every `PolycSubgraph` it made."""

    def __init__(self, target: str = "cpu", options: Mapping[str, Any] | None = None):
        self.target, self.options = target, options
        self.partitions: list[PolycSubgraph] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        return aot_autograd(fw_compiler=self.compile_aten, bw_compiler=self.compile_aten)(
            gm, example_inputs)

    def compile_aten(self, gm: fx.GraphModule, example_inputs: list) -> Callable:
        # boxed: AOTAutograd hands over its list of arguments and may free them early
        return make_boxed_func(partition_graph(gm, self._subgraph))

    def _subgraph(self, name: str, module: fx.GraphModule) -> PolycSubgraph:
        sub = PolycSubgraph(name, module, self.target, self.options)
        self.partitions.append(sub)
        return sub


torch_backend = TorchBackend()
