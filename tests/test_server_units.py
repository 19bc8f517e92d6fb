"""The service's pure parts: content keys, bundles, body checks, error pointers, metrics.

The key must not depend on how a client spells its JSON, and must depend on everything
that changes the generated code; a bundle must refuse any damage; a hostile body must be
refused before a parser recurses into it.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import re

import time

import pytest

from polyc import load_graph, targets
from polyc.compiler import Options
from polyc.errors import Problem
from polyc.server import worker_main
from polyc.server.body import nesting_depth, parse_body
from polyc.server.bundle import CorruptBundle, decode_bundle, encode_bundle
from polyc.server.keys import Toolchain, canonical_graph
from polyc.server.metrics import Metrics
from polyc.server.models import CompileOptions, CompileRequest
from polyc.server.problems import ApiProblem, graph_errors
from polyc.targets.cpu import cpu_machine, host_can_run
from polyc.version import __version__, build_version, source_digest

TOOLCHAIN = Toolchain(polyc="0.1.0", islpy="2026.1", isl="isl-x", targets=(
    ("cpu", (("cc", "gcc"), ("cc_version", "gcc 12"), ("cflags", "-O3"), ("headers", "h0"))),))


def graph_doc(**over):
    doc = {"name": "g",
           "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}],
           "constants": [{"name": "c", "shape": [3], "dtype": "float32", "data": [1, 2.5, 3]}],
           "nodes": [{"op": "add", "inputs": ["x", "c"], "outputs": ["s"]},
                     {"op": "layer_norm", "inputs": ["s"], "outputs": ["y"],
                      "attrs": {"epsilon": 0.001}}],
           "outputs": ["y"]}
    doc.update(over)
    return doc


def key_of(doc, target="cpu", options=Options(), toolchain=TOOLCHAIN, host=("flags=avx2 sse", "")):
    return toolchain.key(canonical_graph(load_graph(doc)), target, options.to_json(), host)


def _cpu(**fields):
    """TOOLCHAIN with some of its cpu fields replaced."""
    return dataclasses.replace(TOOLCHAIN, targets=(("cpu", tuple({**TOOLCHAIN.of("cpu"),
                                                                 **fields}.items())),))


# -- content keys ---------------------------------------------------------------------------

def test_key_ignores_key_order_whitespace_and_number_spelling():
    base = key_of(graph_doc())
    doc = graph_doc()
    doc["constants"][0]["data"] = ["DATA"]
    doc["nodes"][1]["attrs"]["epsilon"] = "EPS"
    text = json.dumps(doc, indent=3, sort_keys=True)
    respelled = text.replace('"DATA"', "1.0, 25e-1, 3e0").replace('"EPS"', "1e-3")
    assert key_of(json.loads(respelled)) == base
    reordered = dict(reversed(list(graph_doc().items())))
    assert key_of(reordered) == base


def test_key_ignores_the_order_nodes_are_listed_in():
    # two independent branches: any listing order is a valid one, and all get one key
    doc = graph_doc(nodes=[{"op": "exp", "inputs": ["x"], "outputs": ["e"]},
                           {"op": "neg", "inputs": ["x"], "outputs": ["n"]},
                           {"op": "add", "inputs": ["e", "n"], "outputs": ["y"]}])
    base = key_of(doc)
    for order in ([1, 0, 2], [2, 1, 0], [2, 0, 1]):
        assert key_of(dict(doc, nodes=[doc["nodes"][k] for k in order])) == base


def test_key_fills_defaults():
    # dtype float32 and attrs left at their defaults spell the same graph
    doc = graph_doc()
    del doc["inputs"][0]["dtype"]
    assert key_of(doc) == key_of(graph_doc())


@pytest.mark.parametrize("change", [
    lambda: key_of(graph_doc(name="other")),
    lambda: key_of(graph_doc(constants=[{"name": "c", "shape": [3], "data": [1, 2.5, 4]}])),
    lambda: key_of(graph_doc(), options=Options(parallel=False)),
    lambda: key_of(graph_doc(), options=Options(max_operations=12345)),
    lambda: key_of(graph_doc(), toolchain=_cpu(cc_version="gcc 13")),
    lambda: key_of(graph_doc(), toolchain=_cpu(cflags="-O2")),
    lambda: key_of(graph_doc(), toolchain=_cpu(headers="h1")),
    lambda: key_of(graph_doc(), toolchain=dataclasses.replace(TOOLCHAIN, islpy="2027.1")),
    lambda: key_of(graph_doc(), toolchain=dataclasses.replace(TOOLCHAIN, polyc="0.2.0")),
    lambda: key_of(graph_doc(), host=("flags=sse", "")),
    lambda: key_of(graph_doc(), host=("flags=avx2 sse", "1700000000:123")),
], ids=["graph-name", "constant", "parallel", "max-ops", "gcc", "cflags", "headers", "islpy",
        "polyc",
        "cpu", "tuning"])
def test_key_covers_everything_that_changes_the_output(change):
    assert change() != key_of(graph_doc())


@pytest.mark.parametrize("dtype,data", [("int32", [1, 2, 3]), ("int64", [1, 2**53 + 1, 3])])
def test_integer_constants_stay_integers_in_the_canonical_form(dtype, data):
    # as floats, 2^53 + 1 would become 2^53: two graphs, one key
    doc = graph_doc(inputs=[{"name": "x", "shape": [3], "dtype": dtype}],
                    constants=[{"name": "c", "shape": [3], "dtype": dtype, "data": data}],
                    nodes=[{"op": "add", "inputs": ["x", "c"], "outputs": ["y"]}])
    assert f'"data":[{",".join(map(str, data))}]'.encode() in canonical_graph(load_graph(doc))


def test_real_toolchain_is_detected():
    tc = Toolchain.detect()
    cpu = tc.of("cpu")
    assert tc.polyc and tc.islpy and cpu["cc_version"] and f"-march={cpu_machine().arch}" in cpu["cflags"]
    assert host_can_run(cpu_machine().arch) == bool(json.loads(cpu["calibration"]))
    assert len(tc.key(b"{}", "cpu", {})) == 64


# -- bundles -------------------------------------------------------------------------------

PARTS = {"record.json": b'{"a": 1}', "kernels.c": b"void f(void) {}\n",
         "kernels.so": b"\x7fELF" * 99}


def test_the_key_tells_two_builds_of_one_release_apart(tmp_path):
    # a cache that outlives an upgrade must not serve what the older code generated
    assert Toolchain.detect().polyc == build_version()
    assert re.fullmatch(rf"{re.escape(__version__)}\+[0-9a-f]{{16}}", build_version())
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "k.c").write_text("int k;\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not a source")
    before = source_digest(tmp_path)
    (tmp_path / "pkg" / "notes.txt").write_text("still not a source")
    assert source_digest(tmp_path) == before
    (tmp_path / "pkg" / "k.c").write_text("int k = 1;\n")
    assert source_digest(tmp_path) != before


def test_bundle_round_trip():
    blob = encode_bundle("k" * 64, PARTS)
    b = decode_bundle(blob, "k" * 64)
    assert b.parts == PARTS and b.size == len(blob)
    assert [p["name"] for p in b.manifest] == list(PARTS)


@pytest.mark.parametrize("damage", [
    lambda b: b[:-1],  # truncated payload
    lambda b: b[:len(b) // 2],  # truncated in the middle
    lambda b: b[:20],  # truncated in the manifest
    lambda b: b + b"x",  # trailing junk
    lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:],  # one bit flipped in the object
    lambda b: b.replace(b'"size":8', b'"size":9'),  # manifest edited
    lambda b: b"",
    lambda b: b"polyc-bundle/2\n" + b[15:],  # another format
], ids=["last-byte", "half", "manifest", "junk", "bit-flip", "edited", "empty", "magic"])
def test_bundle_damage_is_detected(damage):
    blob = encode_bundle("k" * 64, PARTS)
    with pytest.raises(CorruptBundle):
        decode_bundle(damage(blob), "k" * 64)


def test_bundle_filed_under_another_key_is_refused():
    with pytest.raises(CorruptBundle, match="another key"):
        decode_bundle(encode_bundle("a" * 64, PARTS), "b" * 64)


# -- request bodies --------------------------------------------------------------------------

def test_nesting_depth_skips_strings():
    assert nesting_depth(b'{"a": [[1], {"b": []}]}') == 4
    assert nesting_depth(b'{"a": "[[[[[[[[[[", "b": "\\"[[["}') == 1
    assert nesting_depth(b"[" * 100_000) == 100_000


@pytest.mark.parametrize("body, words", [
    (b"", "empty"),
    (b'{"graph": NaN}', "NaN"),
    (b'{"graph": -Infinity}', "Infinity"),
    (b'{"graph": 1e999}', "too large"),
    (b'{"graph": ', "unexpected end of data"),
    (b'{"graph": "\xff"}', "UTF-8"),
    (b"[" * 1_000_000, "levels deep"),
])
def test_bad_bodies_are_refused_with_a_reason(body, words):
    with pytest.raises(ApiProblem) as e:
        parse_body(body, max_depth=64)
    assert e.value.status == 400 and words in e.value.detail


# -- models ------------------------------------------------------------------------------------

def test_compile_options_are_every_targets_options():
    fields: dict = {}
    for kind in targets.option_types():
        for name, value in kind().to_json().items():
            fields.setdefault(name, set()).add(json.dumps(value))
    assert set(CompileOptions.model_fields) == set(fields)
    # one default where the targets agree; none where they differ (each takes its own)
    assert CompileOptions().model_dump(mode="json") == {
        name: json.loads(next(iter(v))) if len(v) == 1 else None for name, v in fields.items()}
    assert "manycore 64, npu 1" in CompileOptions.model_fields["cores"].description
    assert set(CompileRequest.model_fields) == {"graph", "akg", "target", "options"}


# -- pointers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("problem, expected", [
    (Problem("m", None, None, "outputs"), "/graph/outputs"),
    (Problem("m", None, None, "nodes[1]"), "/graph/nodes/1"),
    (Problem("m", "x", None, "shape"), "/graph/inputs/0/shape"),
    (Problem("m", "c", None, "data"), "/graph/constants/0/data"),
    (Problem("m", "y", "layer_norm", "attrs.epsilon"), "/graph/nodes/1/attrs/epsilon"),
    (Problem("m", "s", "add", "inputs"), "/graph/nodes/0/inputs"),
    (Problem("m", "nodes[0]", None, "op"), "/graph/nodes/0/op"),
    (Problem("m", "nowhere", "exp", "a/b"), "/graph/a~1b"),
])
def test_problems_point_at_the_field(problem, expected):
    (error,) = graph_errors(graph_doc(), [problem])
    assert error["pointer"] == expected


def test_pointing_at_many_problems_takes_one_pass():
    # 6,100 nodes each with an unknown op: one problem per node, each pointing at its node
    n = 6100
    doc = {"nodes": [{"op": "nope", "inputs": ["x"], "outputs": [f"t{i}"]} for i in range(n)]}
    problems = [Problem("unknown op", f"t{i}", "nope", "op") for i in reversed(range(n))]
    start = time.process_time()
    errors = graph_errors(doc, problems)
    assert time.process_time() - start < 1.0  # was 2.7 s: every problem scanned every node
    assert len(errors) == 50  # as many as an answer carries
    assert [e["pointer"] for e in errors[:2]] == [f"/graph/nodes/{n - 1}/op",
                                                  f"/graph/nodes/{n - 2}/op"]


# -- worker error mapping ------------------------------------------------------------------------

def test_disk_full_in_the_worker_is_reported_as_such(monkeypatch):
    def full(source, target, *, timeout_s, during):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(worker_main, "build_object", full)
    job = {"key": "k" * 64, "graph": canonical_graph(load_graph(graph_doc())), "target": "cpu",
           "options": Options().to_json(), "limits": __import__("polyc").Limits(),
           "timeout_s": 30, "notes": [], "toolchain": TOOLCHAIN.to_json("cpu")}
    reply = worker_main.run_job(job)
    assert reply[0] == "error" and reply[1] == worker_main.DISK_FULL


@pytest.mark.parametrize("at_limit", [True, False])
def test_an_error_at_the_memory_limit_is_out_of_memory(monkeypatch, at_limit):
    # isl failing to allocate inside islpy's conversion of an argument raises a TypeError
    # that does not say so: at the limit it is the graph's size, elsewhere a polyc bug
    def conversion(source, target, *, timeout_s, during):
        raise TypeError("union(): incompatible function arguments")
    monkeypatch.setattr(worker_main, "build_object", conversion)
    monkeypatch.setattr(worker_main, "near_memory_limit", lambda: at_limit)
    job = {"key": "k" * 64, "graph": canonical_graph(load_graph(graph_doc())), "target": "cpu",
           "options": Options().to_json(), "limits": __import__("polyc").Limits(),
           "timeout_s": 30, "notes": [], "toolchain": TOOLCHAIN.to_json("cpu")}
    reply = worker_main.run_job(job)
    assert reply[1] == (worker_main.OUT_OF_MEMORY if at_limit else worker_main.INTERNAL)


def test_the_memory_limit_is_read_from_the_address_space_and_its_rlimit():
    import subprocess
    import sys
    code = ("import resource; from pathlib import Path; from polyc.server import worker_main as w\n"
            "print(w.near_memory_limit())\n"
            "size = int(Path('/proc/self/status').read_text().split('VmSize:')[1].split()[0])\n"
            "resource.setrlimit(resource.RLIMIT_AS, (size * 1024 + (8 << 20),) * 2)\n"
            "print(w.near_memory_limit(), w.near_memory_limit(margin=1 << 20))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "False"], out.stdout


def test_worker_dirs_of_servers_that_are_gone_are_removed(tmp_path, monkeypatch):
    import subprocess
    import sys
    from polyc.server import workers
    monkeypatch.setattr(workers.tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f"{workers.WORKER_DIR_PREFIX}{gone.stdout.strip()}-abc"
    mine = tmp_path / f"{workers.WORKER_DIR_PREFIX}{os.getpid()}-def"
    for d in (stale, mine):
        (d / "polyc-build-x").mkdir(parents=True)
    workers.remove_stale_worker_dirs()
    assert not stale.exists() and mine.exists()


def test_metrics_render_prometheus_text():
    m = Metrics()
    m.requests.inc(method="GET", route="/x", status="200")
    m.compile_seconds.observe(0.3)
    text = m.render()
    assert 'polyc_http_requests_total{method="GET",route="/x",status="200"} 1' in text
    assert 'polyc_compile_seconds_bucket{le="0.5"} 1' in text
    assert 'polyc_compile_seconds_bucket{le="0.25"} 0' in text
    assert "polyc_compile_seconds_count 1" in text
