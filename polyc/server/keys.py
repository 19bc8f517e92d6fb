"""The content key of a compile: what it covers is explicit (STYLE 13).

key = sha256 over, each part preceded by its length (so no two part lists collide):
  the key format version, the canonical graph JSON, the target, the canonical options
  JSON, the polyc version with a digest of its sources (`version.build_version`), the
  islpy and isl versions, the target's C compiler command, its version and its flags,
  and what the target's backend says changes its code
  (`Backend.key_parts`: for the cpu, built for -march=native, the host's CPU and the
  state of the tuning cache, as `polyc tune` changes tiles). The gemm kernels' speeds
  measured on the host (the cpu's calibration: they choose the default kernel) are not
  in it: they are a function of the CPU, which is, and replicas on one kind of CPU must
  share results although their measurements differ by noise.

The canonical graph JSON is the loader's `Graph.to_json()` (nodes in its canonical
topological order, defaults filled in, attrs normalised) with sorted keys, compact
separators and float constants spelled as floats, so the order nodes are listed in, key
order, whitespace and number spelling (`1`, `1.0`, `1e0`) never change the key.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson

from ..graph.ir import INT_BITS, Graph

KEY_FORMAT = "polyc-service-key/3"


def canonical_json(value) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def canonical_graph(graph: Graph) -> bytes:
    doc = graph.to_json()
    for c in doc["constants"]:
        if c["dtype"] not in INT_BITS:  # float data: 1 and 1.0 are the same value
            c["data"] = [float(v) for v in c["data"]]
    return canonical_json(doc)


@dataclass(frozen=True)
class Toolchain:
    """Everything besides the request that changes the generated code or object: the
    versions of polyc, islpy and isl, and per target its compiler, that compiler's
    version, its flags and the headers it includes, plus what its backend prepared at start-up (shown, not keyed:
    the cpu's measured kernel speeds)."""

    polyc: str
    islpy: str
    isl: str
    targets: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # name -> (field, value)

    @classmethod
    def detect(cls) -> "Toolchain":
        """Blocking (runs each compiler once, measures what backends prepare): call at
        start-up, off the event loop, before any worker compiles."""
        import islpy

        from .. import targets
        from ..codegen.build import compiler_version
        from ..version import build_version
        described = []
        for name in targets.names():
            backend = targets.backend(name)
            machine = backend.machine()
            tc = backend.toolchain(machine)
            fields = {"cc": tc.cc, "cc_version": compiler_version(tc.cc),
                      "cflags": " ".join(tc.unit_build_flags),
                      "headers": tc.headers_digest(), **backend.prepare(machine)}
            described.append((name, tuple(fields.items())))
        return cls(polyc=build_version(), islpy=islpy.VERSION_TEXT, isl=str(islpy.isl_version()),
                   targets=tuple(described))

    def of(self, target: str) -> dict[str, str]:
        return dict(dict(self.targets)[target])

    def to_json(self, target: str) -> dict[str, str]:
        return {"polyc": self.polyc, "islpy": self.islpy, "isl": self.isl, **self.of(target)}

    def key(self, canonical: bytes, target: str, options: dict,
            host: tuple[str, ...] = ()) -> str:
        """`host`: what the target's backend adds (`Backend.key_parts`)."""
        h = hashlib.sha256()
        tc = self.of(target)
        parts = [KEY_FORMAT.encode(), canonical, target.encode(), canonical_json(options),
                 self.polyc.encode(), self.islpy.encode(), self.isl.encode(), tc["cc"].encode(),
                 tc["cc_version"].encode(), tc["cflags"].encode(), tc["headers"].encode(),
                 *(p.encode() for p in host)]
        for part in parts:
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.hexdigest()
