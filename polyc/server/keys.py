"""The content key of a compile: what it covers is explicit (STYLE 13).

key = sha256 over, each part preceded by its length (so no two part lists collide):
  the key format version, the canonical graph JSON, the target, the canonical options
  JSON, the polyc version, the islpy and isl versions, the C compiler command, its
  version and its flags, and for the host target (`cpu`, built with -march=native) the
  host's CPU features and the state of the tuning cache (`polyc tune` changes tiles).
  The gemm kernels' speeds measured on the host (`calibrate`: they choose the default
  kernel) are not in it: they are a function of the CPU, which is, and replicas on one
  kind of CPU must share results although their measurements differ by noise.

The canonical graph JSON is the loader's `Graph.to_json()` (nodes in its canonical
topological order, defaults filled in, attrs normalised) with sorted keys, compact
separators and float constants spelled as floats, so the order nodes are listed in, key
order, whitespace and number spelling (`1`, `1.0`, `1e0`) never change the key.
"""
from __future__ import annotations

import hashlib
import platform
from dataclasses import asdict, dataclass

import orjson

from ..graph.ir import Graph

KEY_FORMAT = "polyc-service-key/1"
HOST_TARGETS = ("cpu",)  # targets whose code is built for the machine it is compiled on


def canonical_json(value) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def canonical_graph(graph: Graph) -> bytes:
    doc = graph.to_json()
    for c in doc["constants"]:
        if c["dtype"] != "int32":  # float data: 1 and 1.0 are the same value
            c["data"] = [float(v) for v in c["data"]]
    return canonical_json(doc)


def cpu_features() -> str:
    """The lines of /proc/cpuinfo that decide what -march=native generates."""
    wanted = ("vendor_id", "cpu family", "model", "model name", "flags")
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            first_cpu = f.read().split("\n\n", 1)[0]
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    found = {}
    for line in first_cpu.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in wanted:
            found[name] = " ".join(sorted(value.split())) if name == "flags" else value.strip()
    return "; ".join(f"{k}={found[k]}" for k in wanted if k in found)


@dataclass(frozen=True)
class Toolchain:
    """Everything besides the request that changes the generated code or object."""

    polyc: str
    islpy: str
    isl: str
    cc: str
    cc_version: str
    cflags: str
    cpu: str
    calibration: str = ""  # the host's measured gemm kernel speeds (shown, not keyed)

    @classmethod
    def detect(cls) -> "Toolchain":
        """Blocking (runs `cc --version` once): call at start-up, off the event loop."""
        import islpy

        from .. import __version__
        from ..codegen.build import CC, cflags, compiler_version
        from ..microkernels import calibrate, registry
        from ..target import cpu_target
        # measured here, once, before any worker compiles: the workers read the file
        target = cpu_target()
        rates = calibrate.rates(target, tuple(m for m in registry.REGISTRY if m.kind == "gemm"
                                              and set(m.features) <= target.features))
        return cls(polyc=__version__, islpy=islpy.VERSION_TEXT, isl=str(islpy.isl_version()),
                   cc=CC, cc_version=compiler_version(), cflags=" ".join(cflags()),
                   cpu=cpu_features(), calibration=canonical_json(rates).decode())

    def to_json(self) -> dict:
        return asdict(self)

    def key(self, canonical: bytes, target: str, options: dict, tuning: str = "") -> str:
        h = hashlib.sha256()
        host = target in HOST_TARGETS
        parts = [KEY_FORMAT.encode(), canonical, target.encode(), canonical_json(options),
                 self.polyc.encode(), self.islpy.encode(), self.isl.encode(), self.cc.encode(),
                 self.cc_version.encode(), self.cflags.encode(),
                 self.cpu.encode() if host else b"", tuning.encode() if host else b""]
        for part in parts:
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.hexdigest()
