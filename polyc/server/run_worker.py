"""In a compile worker: run a stored shared object on seeded random inputs.

The worker rebuilds the kernels' descriptions (the pipeline without gcc, deterministic
for a key) to bind the object's functions, then runs it once against the reference
executor and times each kernel (host targets) or reads the simulated chip's profile.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

RTOL, ATOL = 1e-4, 1e-5  # `polyc run`'s defaults


def run_job(job: dict) -> dict:
    """In the worker: run `job["object"]` on random inputs of `job["seed"]`."""
    import numpy as np

    from .. import targets
    from ..compiler import compile
    from ..graph.load import load_graph
    from ..graph.reference import random_inputs, run_reference
    from ..graph.check import compare_outputs, kernel_times

    graph = load_graph(job["graph"], limits=job["limits"])
    result = compile(graph, job["target"], options=job["options"], build=False)
    backend = targets.backend(job["target"])
    with tempfile.TemporaryDirectory(prefix="polyc-run-") as tmp:
        so = Path(tmp) / "kernels.so"
        so.write_bytes(job["object"])
        program = backend.program(result.primitive, tuple(k.kernel for k in result.kernels),
                                  so, result.machine, result.options)
    inputs = random_inputs(result.graph, job["seed"], job.get("symbols"))
    ref = run_reference(result.graph, inputs)
    names = [k.name for k in result.kernels]
    if program.simulated:
        profile = program.profile(inputs)
        got = profile.pop("outputs")
        per_kernel = profile.pop("kernels")
        kernels = [{"name": n, "seconds": None, "profile": p} for n, p in zip(names, per_kernel)]
    else:
        got = program(inputs)
        out = {k: np.empty_like(v) for k, v in got.items()}
        _, calls = program.bind(inputs, out)
        seconds = kernel_times(calls, job["repeat"])
        kernels = [{"name": n, "seconds": s, "profile": None} for n, s in zip(names, seconds)]
        profile = None
    return {"outputs": compare_outputs(result.graph, got, ref, rtol=RTOL, atol=ATOL),
            "kernels": kernels, "profile": profile}
