"""Tuning on the machines of a Ray cluster: `polyc tune --cluster ADDRESS`.

The driver (the process running `polyc tune`) builds the candidates as local tuning
does and keeps the fastest the same way; only the measurements move: each candidate
is compiled and timed by a Ray task on a machine of the cluster.

- Which machines: each live node is first asked, by a small task pinned to it, for its
  CPU kind (`tuning.machine_id`: model, cores, -march and its features) and its polyc
  version. A measurement holds only where these are the driver's (the driver's model
  chose the candidates, and the result is kept under the driver's machine), so other
  nodes, and nodes that cannot import polyc or offer no CPU, are left out, each with a
  line saying why.
- One measurement at a time per machine: a task is pinned to its node and reserves all
  the CPUs the node offers, and the driver keeps one task in flight per node, so two
  measurements (or other Ray work asking for CPUs) never share a machine while one is
  timed. Candidates go to whichever node is free next.
- A node lost mid-way (its task's worker or the node died) is left out and its
  candidate measured elsewhere; a compile that fails on a worker is an error, as it is
  in local tuning.

ADDRESS is what `ray.init` takes: `ray://HOST:PORT` (Ray Client, from outside the
cluster; needs `ray[client]`), `HOST:PORT` of the head's GCS for a driver on a machine
of the cluster, or `auto` for the cluster started on this machine. Every worker needs
polyc importable (installed, or on PYTHONPATH when its node was started) and gcc.
"""
from __future__ import annotations

import socket
from collections import deque
from dataclasses import dataclass
from typing import Iterator

from ..errors import PolycError
from ..graph.ir import Graph
from ..graph.load import load_graph
from ..targets import backend
from ..targets.cpu.tuning import machine_id
from ..version import __version__
from . import Measurement, measure_here

PROBE_TIMEOUT_S = 60.0  # a node that has not described itself by then is left out


@dataclass(frozen=True)
class Node:
    id: str
    host: str
    cpus: int


def describe_node(target: str) -> dict[str, str]:
    """Run on a node: what decides whether its measurements hold for the driver."""
    return {"kind": machine_id(backend(target).machine()), "polyc": __version__,
            "host": socket.gethostname()}


def measure_on_node(graph_doc: dict, target: str, options, m: Measurement, repeat: int
                    ) -> float:
    """Run on a node: the seconds of one candidate, as local tuning measures it."""
    [(_, seconds)] = measure_here(graph_doc, target, options, [m], repeat)
    return seconds


class RayCluster:
    """A connection to a Ray cluster; `measure` is a `polyc.tune.Measure`. `notes`
    says which nodes measured and why others did not."""

    def __init__(self, address: str):
        try:
            import ray
        except ImportError:
            raise PolycError("polyc tune --cluster needs Ray on this machine: "
                             "pip install 'polyc[cluster]'") from None
        self.ray = ray
        self.address = address
        self.notes: list[str] = []

    def __enter__(self) -> "RayCluster":
        _check_reachable(self.address)
        try:
            self.ray.init(address=self.address, log_to_driver=False)
        except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError...
            raise PolycError(f"cannot reach the Ray cluster at {self.address}: "
                             f"{_summary(e)}") from None
        return self

    def __exit__(self, *exc) -> None:
        self.ray.shutdown()

    def _pinned(self, fn, node: Node, cpus: int):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        return self.ray.remote(fn).options(
            num_cpus=cpus, max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.id, soft=False))

    def nodes(self, target: str) -> list[Node]:
        """The live nodes whose measurements hold for this machine (see the module
        docstring); the others are named in `notes`."""
        ray = self.ray
        kind = machine_id(backend(target).machine())
        candidates = []
        for info in ray.nodes():
            if not info.get("Alive"):
                continue
            node = Node(info["NodeID"], info.get("NodeManagerHostname") or
                        info.get("NodeManagerAddress", "?"),
                        int(info.get("Resources", {}).get("CPU", 0)))
            if node.cpus < 1:
                self.notes.append(f"node {node.host}: left out, it offers no CPU to Ray")
            else:
                candidates.append(node)
        probes = {self._pinned(describe_node, node, 0).remote(target): node
                  for node in candidates}
        ready, late = (ray.wait(list(probes), num_returns=len(probes), timeout=PROBE_TIMEOUT_S)
                       if probes else ([], []))
        usable = []
        for ref in late:
            ray.cancel(ref, force=True)
            self.notes.append(f"node {probes[ref].host}: left out, it did not answer "
                              f"within {PROBE_TIMEOUT_S:g} s")
        for ref in ready:
            node = probes[ref]
            try:
                found = ray.get(ref)
            except Exception as e:  # polyc not importable there, the node died...
                self.notes.append(f"node {node.host}: left out, it cannot run polyc: "
                                  f"{_summary(e)}")
                continue
            if found["kind"] != kind:
                self.notes.append(f"node {found['host']}: left out, its CPU kind "
                                  f"{found['kind']} is not this machine's ({kind})")
            elif found["polyc"] != __version__:
                self.notes.append(f"node {found['host']}: left out, it runs polyc "
                                  f"{found['polyc']}, not {__version__}")
            else:
                usable.append(Node(node.id, found["host"], node.cpus))
        if not usable:
            raise PolycError("no node of the Ray cluster at " + self.address + " can measure "
                             f"for this machine ({kind})" +
                             "".join(f"; {note}" for note in self.notes))
        return usable

    def measure(self, graph, target: str, options, measurements: list[Measurement],
                repeat: int) -> Iterator[tuple[Measurement, float]]:
        ray = self.ray
        doc = (graph if isinstance(graph, Graph) else load_graph(graph)).to_json()
        free = self.nodes(target)
        used = {node.host for node in free}
        todo = deque(measurements)
        running = {}  # task -> (node, measurement)
        while todo or running:
            while todo and free:
                node, m = free.pop(), todo.popleft()
                task = self._pinned(measure_on_node, node, node.cpus).remote(
                    doc, target, options, m, repeat)
                running[task] = (node, m)
            if not running:
                raise PolycError("every node of the Ray cluster was lost while measuring"
                                 + "".join(f"; {note}" for note in self.notes))
            [done], _ = ray.wait(list(running), num_returns=1)
            node, m = running.pop(done)
            try:
                seconds = ray.get(done)
            except ray.exceptions.RayTaskError as e:  # the compile or the run failed
                raise PolycError(f"measuring {m.microkernel} {dict(m.tiles)} on {node.host} "
                                 f"failed: {_summary(getattr(e, 'cause', None) or e)}") from None
            except ray.exceptions.RayError as e:  # the worker or the node is gone
                self.notes.append(f"node {node.host}: lost while measuring "
                                  f"({_summary(e)}); its candidate goes elsewhere")
                todo.appendleft(m)
                continue
            free.append(node)
            yield m, seconds
        self.notes.insert(0, f"measured on {len(used)} node(s) of the Ray cluster: "
                             + ", ".join(sorted(used)))


def _summary(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


def _check_reachable(address: str) -> None:
    """Fail at once, naming the address, when nothing listens there: Ray itself waits
    30 s for a Ray Client address and much longer for a GCS one."""
    if address == "auto":  # Ray finds the cluster started on this machine, or says so
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except ValueError:
        raise PolycError(f"--cluster {address}: expected ray://HOST:PORT, HOST:PORT or "
                         "auto") from None
    except OSError as e:
        raise PolycError(f"cannot reach the Ray cluster at {address}: {e}") from None
