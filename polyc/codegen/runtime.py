"""Running compiled kernels from Python through ctypes.

A `Program` owns the loaded shared object, the constants as numpy arrays and reusable
buffers for intermediates, and calls the kernels in order. Inputs are checked (names,
shapes, dtypes) before any pointer reaches C. The kernels themselves use OpenMP threads;
a Program serves one call at a time (its intermediate buffers are shared between calls).
A symbolic graph's call binds its symbols from the inputs' shapes (refusing a mismatch),
allocates with the bound shapes and passes the values to the kernels after the arrays.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import GraphError, Problem
from ..graph.ir import Graph
from ..graph.binding import bind_symbols, bound_shape
from ..graph.reference import bind_inputs, constant_value
from ..graph.symbols import C_PREFIX
from ..kernel import Kernel


class Program:
    simulated = False  # True when the kernels run on a simulated chip (see `profile`)

    def __init__(self, graph: Graph, kernels: tuple[Kernel, ...], so_path: Path):
        self.graph = graph
        self.kernels = kernels
        self._lib = ctypes.CDLL(str(so_path))
        self._fns = []
        for k in kernels:
            fn = getattr(self._lib, k.name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * len(k.params) + [ctypes.c_int64] * len(k.symbols)
            self._fns.append(fn)
        # the constants a kernel reads or the graph returns (the scalars are in the C, a
        # symbolic mean's 1/N among them); those as long as a symbol made per binding
        needed = {a.tensor for k in kernels for a in k.params} | set(graph.outputs)
        used = [c for c in graph.constants if c.name in needed]
        self._constants = {c.name: constant_value(c) for c in used if c.type.static}
        sized = [c for c in used if not c.type.static]
        self._sized_constants = functools.lru_cache(maxsize=8)(
            lambda binding: {c.name: constant_value(c, dict(binding)) for c in sized})
        self._scratch: dict[str, np.ndarray] = {}  # intermediates, reused across calls
        # the data addresses of the arrays kept across calls (constants, intermediates),
        # by tensor: `ndarray.ctypes` costs microseconds, 41 times a transformer block's
        # call (bind was 15-20% of the block's 1.2 ms)
        self._addresses = {name: a.ctypes.data for name, a in self._constants.items()}
        self._params = [k.params for k in kernels]
        # a symbolic graph's binding per input shapes, and the shapes of its outputs and
        # the kernels' arrays per binding: sympy is slow per call, and so is hashing
        # the graph or a type (microseconds, on kernels that take a few)
        binds = functools.lru_cache(maxsize=64)(lambda shapes: bind_symbols(graph, dict(shapes)))
        self._bind = lambda g, shapes: binds(tuple(shapes.items()))
        self._shapes = functools.lru_cache(maxsize=64)(self._bound_shapes)

    @functools.cached_property
    def _direct(self) -> tuple[list, list, list] | None:
        """A static graph's calls laid out at its first call: each kernel's argument list
        with the addresses of constants and intermediates in place, and where the inputs'
        and outputs' go. A call that passes dense arrays of the right types then costs a
        check and an address per array (a 2-kernel MLP's call: 7 us of `bind` for 33 us
        of kernels, where onnxruntime's whole call took 43). None for a symbolic graph, or
        where an output is an input or a constant (copied, not computed)."""
        given = {t.name for t in self.graph.inputs}
        if self.graph.symbols or any(name in given or name in self._constants
                                     for name in self.graph.outputs):
            return None
        typed = lambda names: [(n, self.graph.types[n].shape, np.dtype(self.graph.types[n].dtype))
                               for n in names]
        inputs, outputs = typed(sorted(given)), typed(self.graph.outputs)
        passed = given | set(self.graph.outputs)
        kernels = []
        for params, fn in zip(self._params, self._fns):
            args, places = [], []
            for a in params:
                if a.tensor in passed:
                    places.append((len(args), a.tensor))
                    args.append(0)
                    continue
                args.append(self._addresses[a.tensor] if a.tensor in self._constants
                            else self._intermediate(a.tensor, a.type.shape, a.type.dtype))
            kernels.append((fn, args, places))
        return inputs, outputs, kernels

    def _intermediate(self, tensor: str, shape: tuple[int, ...], dtype) -> int:
        """The address of `tensor`'s buffer, kept across calls (made anew where a symbolic
        graph's binding changed its shape)."""
        kept = self._scratch.get(tensor)
        if kept is None or kept.shape != shape:
            self._scratch[tensor] = kept = np.empty(shape, dtype)
            self._addresses[tensor] = kept.ctypes.data
        return self._addresses[tensor]

    def _call_direct(self, inputs: Mapping[str, np.ndarray],
                     out: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
        """`__call__` by the direct plan, or None where an array is not as the kernels
        take it (`bind` converts it, or names the problem)."""
        typed, outputs, kernels = self._direct
        if len(inputs) != len(typed):
            return None
        at = {}
        for name, shape, dtype in typed:
            a = inputs.get(name)
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype \
                    or not a.flags.c_contiguous:
                return None
            at[name] = a.ctypes.data
        results = {}
        for name, shape, dtype in outputs:
            a = None if out is None else out.get(name)
            if a is None:
                a = np.empty(shape, dtype)
            elif type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype \
                    or not a.flags.c_contiguous or not a.flags.writeable:
                return None
            results[name] = a
            at[name] = a.ctypes.data
        self.run_at(at)
        return results

    def run_at(self, addresses: Mapping[str, int]) -> bool:
        """Runs the kernels on memory the caller vouches for: the data address of every
        input and output, by name, each a dense row-major array of the graph's shape and
        dtype (a contiguous tensor's `data_ptr()`: PyTorch's calls skip numpy's views,
        microseconds a call). Nothing is checked. False, and nothing run, where the
        program has no such call (see `_direct`): `__call__` then."""
        if self._direct is None:
            return False
        for fn, args, places in self._direct[2]:
            for i, name in places:
                args[i] = addresses[name]
            fn(*args)
        return True

    def _bound_shapes(self, binding: tuple[tuple[str, int], ...]) -> dict[str, tuple[int, ...]]:
        """The shape of every output and kernel array once the symbols take `binding`."""
        values = dict(binding)
        c_values = {C_PREFIX + k: v for k, v in values.items()}  # the kernels' names
        shapes = {a.tensor: bound_shape(a.type, c_values) for k in self.kernels for a in k.params}
        shapes.update({name: bound_shape(self.graph.types[name], values)
                       for name in self.graph.outputs})
        return shapes

    def _output_buffer(self, name: str, out: Mapping[str, np.ndarray] | None,
                       shapes: Mapping[str, tuple[int, ...]]) -> np.ndarray:
        t = self.graph.types[name]
        shape = shapes[name]
        if out is not None and name in out:
            a = out[name]
            if (not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != np.dtype(t.dtype)
                    or not a.flags.c_contiguous or not a.flags.writeable):
                raise GraphError(Problem(f"out[{name!r}] must be a writeable C-contiguous "
                                         f"{t.dtype}[{','.join(map(str, shape))}] array",
                                         field="out"))
            return a
        return np.empty(shape, t.dtype)

    def __call__(self, inputs: Mapping[str, np.ndarray],
                 out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        if self._direct is not None:
            results = self._call_direct(inputs, out)
            if results is not None:
                return results
        results, calls = self.bind(inputs, out)
        for call in calls:
            call()
        return results

    def bind(self, inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray] | None = None
             ) -> tuple[dict[str, np.ndarray], list[Callable[[], None]]]:
        """The output arrays, and one call per kernel in order, each bound to its buffers:
        calling them all computes the outputs; one alone can be timed (after the ones
        before it have filled its inputs)."""
        # C reads dense row-major buffers; a 0-d array is dense already
        checked, binding = bind_inputs(self.graph, inputs, self._bind)
        env = {k: v if v.flags.c_contiguous else np.ascontiguousarray(v)
               for k, v in checked.items()}
        env.update(self._constants)
        key = tuple(binding.items())
        env.update(self._sized_constants(key))
        shapes = self._shapes(key)
        results = {}
        for name in self.graph.outputs:
            if name in env:  # an input or a constant returned as is: copy, never alias
                buf = self._output_buffer(name, out, shapes)
                np.copyto(buf, env[name])
                results[name] = buf
            else:
                results[name] = env[name] = self._output_buffer(name, out, shapes)
        c_values = {C_PREFIX + k: v for k, v in binding.items()}  # the kernels' names
        addresses = {name: a.ctypes.data for name, a in env.items()
                     if name not in self._addresses}
        addresses.update(self._addresses)
        calls = []
        for kernel, params, fn in zip(self.kernels, self._params, self._fns):
            args = []
            for a in params:
                if a.tensor not in env:
                    addresses[a.tensor] = self._intermediate(a.tensor, shapes[a.tensor],
                                                             a.type.dtype)
                    env[a.tensor] = self._scratch[a.tensor]
                args.append(addresses[a.tensor])
            args += [c_values[name] for name in kernel.symbols]
            call = functools.partial(fn, *args)
            call.arrays = env  # what the addresses point into (the contiguous copies made
            calls.append(call)  # here among them) lives as long as the call
        return results, calls
