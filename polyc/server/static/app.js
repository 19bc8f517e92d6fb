// The browser view: compile a subgraph or open /k/{key}, then look at every decision
// and edit it. Every edit is a compile request with options (kernel_tile_sizes,
// fuse_force, fuse_forbid, gemm_kernel): the service re-checks it with isl, and the
// result is cached under its own key like any other.
import { append, clear, el } from "./dom.js";
import { graphPictures, openKernel } from "./graph.js";
import { diffLines, treeLines, treeView } from "./tree.js";

const $ = (id) => document.getElementById(id);
let record = null; // the result on screen (GET /v1/kernels/{key})
let choices = []; // the microkernels the registry has for its target (GET /v1/microkernels)

async function call(method, url, body) {
  const init = { method, headers: {} };
  if (body !== undefined) { init.body = JSON.stringify(body); init.headers["content-type"] = "application/json"; }
  const r = await fetch(url, init);
  const data = await r.json().catch(() => ({ detail: `HTTP ${r.status}` }));
  return { ok: r.ok, status: r.status, data };
}

function showProblem(box, p) {
  clear(box).hidden = false;
  box.appendChild(el("strong", { text: p.title ? `${p.title}: ` : "Error: " }));
  box.appendChild(el("span", { class: "detail", text: p.detail || "" }));
  for (const e of p.errors || []) box.appendChild(el("div", { class: "mono", text: `${e.pointer || "/"}: ${e.message}` }));
}

async function compile(request, errorBox) {
  $("error").hidden = true; $("edit-error").hidden = true;
  $("status").textContent = "compiling…";
  const start = performance.now();
  const r = await call("POST", "/v1/compile", request);
  if (!r.ok) { $("status").textContent = ""; showProblem(errorBox, r.data); return false; }
  const secs = ((performance.now() - start) / 1000).toFixed(2);
  history.pushState(null, "", `/k/${r.data.key}`);
  await open(r.data.key);
  $("status").textContent = `${r.data.cache_hit ? "answered from the cache" : "compiled"} in ${secs} s`;
  return true;
}

async function open(key) {
  const r = await call("GET", `/v1/kernels/${key}`);
  if (!r.ok) { showProblem($("error"), r.data); $("result").hidden = true; return; }
  record = r.data;
  choices = await microkernelChoices(record);
  render();
}

// Only a target whose options pick the gemm kernel (cpu: gemm_kernel) offers a choice
async function microkernelChoices(rec) {
  if (!("gemm_kernel" in rec.options)) return [];
  const q = new URLSearchParams({ target: rec.target, isa: rec.options.microkernel_isa || "" });
  const r = await call("GET", `/v1/microkernels?${q}`);
  return r.ok ? r.data : [];
}

// -- the page ----------------------------------------------------------------------------
function render() {
  $("graph").value = graphText(keptAside(record.graph));
  $("options").value = JSON.stringify(edits(record.options));
  $("target").value = record.target;
  renderSummary();
  clear($("graph-view"));
  append($("graph-view"), graphPictures(record));
  renderFusion();
  renderKernels();
  renderSource();
  clear($("run"));
  $("result").hidden = false;
}

// indented while it reads well; a large graph one node a line, since laying out a
// textarea of tens of thousands of lines holds the tab for a good fraction of a second
function graphText(graph) {
  if (graph.nodes.length <= 100) return JSON.stringify(graph, null, 1);
  const { nodes, ...rest } = graph;
  const head = JSON.stringify({ ...rest, nodes: [] });
  return `${head.slice(0, -2)}[\n${nodes.map((n) => JSON.stringify(n)).join(",\n")}\n]}`;
}

// a constant's data past a few values is kept aside, not laid out in the textarea (a
// 3x3 conv2d's 590K weights, one a line, froze the tab for 26 s): a note stands in its
// place, and a compile from the form puts the data back where the note still is
const KEPT_PAST = 64;
let kept = new Map(); // note -> data

function keptAside(graph) {
  kept = new Map();
  if (!graph || !Array.isArray(graph.constants)) return graph;
  return { ...graph, constants: graph.constants.map((c) => {
    if (!c || !Array.isArray(c.data) || c.data.length <= KEPT_PAST) return c;
    const note = `${c.data.length} values of ${c.name}, kept by the page`;
    kept.set(note, c.data);
    return { ...c, data: note };
  }) };
}

function putBack(graph) {
  if (!graph || !Array.isArray(graph.constants)) return graph;
  return { ...graph, constants: graph.constants.map((c) =>
    (c && typeof c.data === "string" && kept.has(c.data) ? { ...c, data: kept.get(c.data) } : c)) };
}

function edits(options) {
  const out = {};
  for (const k of ["kernel_tile_sizes", "fuse_force", "fuse_forbid"]) if (options[k] && options[k].length) out[k] = options[k];
  // the microkernel choice, and the ISA that narrows it, stay with the next compile
  for (const k of ["microkernel_isa", "gemm_kernel"]) if (options[k]) out[k] = options[k];
  // so does the convolution's algorithm, where it is not the default
  if (options.winograd === false) out.winograd = false;
  if (options.winograd_tile) out.winograd_tile = options.winograd_tile;
  if (options.winograd_max_tile > 2) out.winograd_max_tile = options.winograd_max_tile;
  return out;
}

function renderSummary() {
  const box = clear($("summary"));
  const link = el("a", { href: `/k/${record.key}`, id: "share", text: `/k/${record.key.slice(0, 16)}…` });
  box.appendChild(el("p", {}, el("strong", { text: record.graph_name }), ` on ${record.target} · shareable link `, link));
  const applied = edits(record.options);
  if (Object.keys(applied).length) box.appendChild(el("p", { class: "mono", text: `edits: ${JSON.stringify(applied)}` }));
  for (const n of record.notes || []) box.appendChild(el("p", { class: "hint", text: n }));
  // a budget that ran out: the result is correct, but a stage took its cheaper answer
  for (const f of record.fallbacks || []) box.appendChild(el("p", { class: "hint fallback", text: f }));
  const total = sum(record.timings);
  // kernels by the time their passes took, slowest first: where a compile's time went
  const perKernel = Object.fromEntries(record.kernels.filter((k) => k.timings).map((k) => [k.name, sum(k.timings)])
    .sort((a, b) => b[1] - a[1]));
  const build = record.timings.build;
  box.appendChild(el("details", { id: "timings" },
    el("summary", { text: `compile time: ${ms(total)}${build !== undefined ? ` (gcc ${ms(build)})` : ""}` }),
    el("div", { class: "timing-tables" },
      el("div", {}, el("h3", { text: "whole graph, by stage" }), timingTable(record.timings, "graph-times")),
      el("div", {}, el("h3", { text: `by kernel (${record.kernels.length}), its passes` }),
        timingTable(perKernel, "kernel-compile-times", (name) => el("a", { href: "#", text: name, onclick: (ev) => { ev.preventDefault(); openKernel(name); } }))))));
}

const sum = (timings) => Object.values(timings || {}).reduce((a, b) => a + b, 0);
const ms = (s) => `${(s * 1e3).toFixed(1)} ms`;
const TIMING_ROWS = 40; // a graph of hundreds of kernels: the slowest, then a count

// rows of name, milliseconds and a bar scaled to the largest
function timingTable(timings, cls, name = (n) => n) {
  const entries = Object.entries(timings || {});
  const top = Math.max(1e-9, ...entries.map(([, s]) => s));
  const rows = entries.slice(0, TIMING_ROWS).map(([stage, s]) => {
    const bar = el("span", { class: "bar" });
    bar.style.width = `${Math.max(1, 160 * s / top)}px`; // CSSOM: allowed by the CSP
    return el("tr", {}, el("td", {}, name(stage)), el("td", { class: "mono", text: ms(s) }), el("td", {}, bar));
  });
  if (entries.length > TIMING_ROWS) rows.push(el("tr", {}, el("td", { class: "hint", text: `and ${entries.length - TIMING_ROWS} more` })));
  return el("table", { class: cls }, rows);
}

const PROPOSAL = /^(vertical|horizontal|forced|widening)/;
const SHOWN_DECISIONS = 100; // a graph of thousands of nodes: laying out every line freezes the tab

function renderFusion() {
  const lines = [...new Set(record.kernels.flatMap((k) => k.fusion_report.filter((l) => PROPOSAL.test(l))))];
  const item = (l) => el("li", { class: l.startsWith("forced") ? "forced" : l.includes(": rejected: ") ? "rejected" : "fused", text: l });
  const list = el("ul", { class: "fusion" }, lines.slice(0, SHOWN_DECISIONS).map(item));
  if (lines.length > SHOWN_DECISIONS) { // the rest are built when asked for
    const rest = el("details", {}, el("summary", { text: `${lines.length - SHOWN_DECISIONS} more decisions` }));
    rest.addEventListener("toggle", () => { if (rest.children.length === 1) rest.appendChild(el("ul", { class: "fusion" }, lines.slice(SHOWN_DECISIONS).map(item))); });
    list.appendChild(el("li", { class: "more" }, rest));
  }
  clear($("fusion")).appendChild(lines.length ? list : el("p", { class: "hint", text: "one node: nothing to fuse" }));
  const names = [...new Set(record.kernels.flatMap((k) => k.nodes))];
  clear($("node-names"));
  for (const n of names) $("node-names").appendChild(el("option", { value: n }));
  const box = clear($("edits"));
  for (const key of ["kernel_tile_sizes", "fuse_force", "fuse_forbid"]) {
    (record.options[key] || []).forEach((entry, i) => {
      box.appendChild(el("div", { class: "edit" }, el("span", { class: "mono", text: `${key}: ${JSON.stringify(entry)}` }),
        el("button", { type: "button", text: "undo", onclick: () => edit((o) => { o[key] = o[key].filter((_, j) => j !== i); }) })));
    });
  }
}

function edit(change) {
  const options = structuredClone(record.options);
  change(options);
  return compile({ graph: record.graph, target: record.target, options }, $("edit-error"));
}

function fusionEdit(key) {
  const a = $("fuse-a").value.trim(), b = $("fuse-b").value.trim();
  edit((o) => { o[key] = [...(o[key] || []), [a, b]]; });
}

function renderKernels() {
  const box = clear($("kernels"));
  record.kernels.forEach((k, index) => box.appendChild(kernelView(k, index)));
}

function kernelView(k, index) {
  const passes = Object.keys(k.trees);
  const treeBox = el("div", { class: "tree-box" });
  const buttons = el("div", { class: "passes" }, "tree after: ");
  const show = (name) => {
    for (const b of buttons.querySelectorAll("button")) b.classList.toggle("active", b.dataset.pass === name);
    clear(treeBox).appendChild(treeView(k.trees[name], { promoted: k.promoted || [], target: record.target }));
  };
  for (const name of passes) buttons.appendChild(el("button", { type: "button", "data-pass": name, text: name, onclick: () => show(name) }));

  const pick = (id) => el("select", { class: id }, passes.map((p) => el("option", { value: p, text: p })));
  const from = pick("diff-from"), to = pick("diff-to");
  to.selectedIndex = passes.length - 1;
  const diffBox = el("pre", { class: "diff" });
  const diff = () => {
    const d = diffLines(treeLines(k.trees[from.value]), treeLines(k.trees[to.value]));
    clear(diffBox);
    if (!d) { diffBox.textContent = "trees too large to diff here"; return; }
    for (const [kind, line] of d) diffBox.appendChild(el("span", { class: kind, text: (kind === "add" ? "+ " : kind === "del" ? "- " : "  ") + line }));
  };

  const sizes = el("input", { class: "tile-sizes", placeholder: "e.g. 32, 64", size: "12" });
  const tile = el("button", { type: "button", class: "tile-apply", text: "Tile with these sizes", onclick: () => {
    const list = sizes.value.split(/[\s,]+/).filter(Boolean).map(Number);
    edit((o) => { o.kernel_tile_sizes = [...(o.kernel_tile_sizes || []).filter(([n]) => n !== k.name), [k.name, list]]; });
  } });
  const editRow = el("div", { class: "edit" }, tile, sizes);
  const microkernel = microkernelEdit(k);
  const winograd = winogradEdit(k);

  const arrays = new Map(k.arrays.map((a) => [a.tensor, a.c_name]));
  const stmts = el("div", { class: "mono" }, (k.provenance || []).map((p, i) => el("span", {
    class: "stmt", "data-statement": p.statement, text: k.statements[i],
    onclick: (ev) => highlight(k, p, arrays.get(p.writes), ev.currentTarget, treeBox),
  })));
  const other = k.fusion_report.filter((l) => !PROPOSAL.test(l));
  const view = el("details", { class: "kernel", "data-kernel": k.name },
    el("summary", { text: `${k.name} · ${k.nodes.length} node(s)${k.microkernels.length ? " · " + k.microkernels.join(", ") : ""}` }),
    el("div", { class: "hint", text: `nodes: ${k.nodes.join(", ")}` }),
    el("h3", { text: "Statements (click: mark in the C and the tree)" }), stmts,
    el("h3", { text: "Schedule tree" }), buttons, promotedTable(k), treeBox,
    el("div", { class: "edit" }, "diff ", from, " → ", to, el("button", { type: "button", class: "diff-button", text: "Diff", onclick: diff })), diffBox,
    el("h3", { text: "Edit and re-check" }), editRow, microkernel, winograd,
    other.length ? el("ul", {}, other.map((l) => el("li", { text: l }))) : null,
    k.timings ? el("details", { class: "kernel-timing" }, el("summary", { text: `compile time: ${ms(sum(k.timings))}` }), timingTable(k.timings, "stage-times"))
      : el("p", { class: "hint", text: "compile time per kernel: not recorded (an older polyc stored this result)" }),
    el("details", {}, el("summary", { text: "dependences" }), el("pre", { text: k.dependences })));
  if (index < 4) view.open = true;
  // the tree is built when the kernel is first opened: many kernels stay cheap
  const first = () => { if (!treeBox.firstChild && passes.length) show(passes[passes.length - 1]); };
  if (view.open) first(); else view.addEventListener("toggle", first);
  return view;
}

// A select of the gemm kernels the registry has for this target: those the target
// offers (its features, options.microkernel_isa), and the others, which the service
// refuses with its reason. The choice is options.gemm_kernel: every contraction.
function microkernelEdit(k) {
  const gemms = choices.filter((c) => c.kind === "gemm");
  if (!gemms.some((c) => k.microkernels.includes(c.name))) return null;
  const option = (c) => el("option", { value: c.name, text: `${c.name} (${c.tile.join("x")} tile${c.features.length ? ", needs " + c.features.join("+") : ""})` });
  const offered = gemms.filter((c) => c.offered), other = gemms.filter((c) => !c.offered);
  const select = el("select", { class: "gemm-kernel" },
    el("option", { value: "", text: "the fastest measured (default)" }),
    el("optgroup", { label: "offered by this target" }, offered.map(option)),
    other.length ? el("optgroup", { label: "not offered here (the service says why)" }, other.map(option)) : null);
  select.value = record.options.gemm_kernel || "";
  return el("div", { class: "edit" }, "gemm microkernel (every contraction):", select,
    el("button", { type: "button", class: "gemm-apply", text: "Use this microkernel", onclick: () => edit((o) => { o.gemm_kernel = select.value; }) }),
    el("span", { class: "hint", text: `now: ${k.microkernels.join(", ")}` }));
}

// The algorithm of the graph's 3x3 convolutions of stride 1 (cpu): the plan's choice, the
// direct convolution, or one of Winograd's tiles. Shown on a kernel with such a
// convolution (its report line says which algorithm and why), or on every contraction
// once the options carry a choice (to take it back).
const CONV3X3 = /, 3x3, stride 1\) (by Winograd's|direct, not by Winograd)/;
const WINOGRAD = [["", "the plan's choice (default)", (o) => {}],
  ["direct", "direct (winograd: false)", (o) => { o.winograd = false; }],
  ["2", "Winograd F(2x2, 3x3) (winograd_tile: 2)", (o) => { o.winograd_tile = 2; }],
  ["4", "Winograd F(4x4, 3x3) (winograd_tile: 4)", (o) => { o.winograd_tile = 4; }],
  ["max4", "F(4x4, 3x3) allowed where it pays (winograd_max_tile: 4)", (o) => { o.winograd_max_tile = 4; }]];
function winogradEdit(k) {
  const o = record.options;
  if (!("winograd" in o)) return null;
  const now = o.winograd === false ? "direct" : o.winograd_tile ? String(o.winograd_tile) : o.winograd_max_tile > 2 ? "max4" : "";
  const planned = k.microkernels.filter((m) => m.startsWith("winograd_"));
  if (!k.fusion_report.some((l) => CONV3X3.test(l)) && !(now && k.microkernels.length)) return null;
  const select = el("select", { class: "winograd" }, WINOGRAD.map(([value, text]) => el("option", { value, text })));
  select.value = now;
  const apply = () => edit((opts) => {
    delete opts.winograd; delete opts.winograd_tile; delete opts.winograd_max_tile;
    WINOGRAD.find(([value]) => value === select.value)[2](opts);
  });
  return el("div", { class: "edit" }, "3x3 convolutions (every one):", select,
    el("button", { type: "button", class: "winograd-apply", text: "Use this algorithm", onclick: apply }),
    el("span", { class: "hint", text: `now: ${planned.join(", ") || "direct"}` }));
}

// Chip targets: each buffer in a faster level, with its size and where its copies run
function promotedTable(k) {
  if (!(k.promoted || []).length) return null;
  const head = el("tr", {}, ["buffer", "level", "of", "shape", "bytes", "copies", "tile mark"].map((h) => el("th", { text: h })));
  const copies = { in: "in", out: "out", inout: "in and out", local: "none (lives there)" };
  return el("details", { class: "promoted", open: "" }, el("summary", { text: `promoted buffers: ${k.promoted.length}` }),
    el("table", {}, head, k.promoted.map((p) => el("tr", {}, el("td", { class: "mono", text: p.buffer }), el("td", { class: `level level-${p.level}`, text: p.level }),
      el("td", { class: "mono", text: p.statements.length ? `${p.array} for ${p.statements.join(", ")}` : p.array }), el("td", { class: "mono", text: p.shape.join("x") }), el("td", { class: "mono", text: p.bytes.toLocaleString() }),
      el("td", { text: copies[p.direction] || p.direction }), el("td", { class: "mono", text: p.at || "none: copied once, before everything" })))));
}

// -- provenance: statement <-> lines of C <-> tree nodes ----------------------------------
function highlight(k, p, cName, target, treeBox) {
  for (const n of document.querySelectorAll(".hot")) n.classList.remove("hot");
  target.classList.add("hot");
  const lines = [...$("csource").children];
  const start = lines.findIndex((s) => s.textContent.includes(`void ${k.name}(`));
  let end = lines.findIndex((s, i) => i > start && /^void polyc_/.test(s.textContent));
  if (end < 0) end = lines.length;
  const comment = new RegExp(`\\b${p.statement}\\b`);
  let first = null;
  for (let i = Math.max(0, start); i < end; i++) {
    const t = lines[i].textContent;
    const assigns = cName && t.includes(cName) && /[^=!<>]=[^=]/.test(t) && t.indexOf(cName) < t.search(/[^=!<>]=[^=]/) + 1;
    if (comment.test(t) || assigns) { lines[i].classList.add("hot"); first = first || lines[i]; }
  }
  if (first) first.scrollIntoView({ block: "nearest" });
  for (const a of treeBox.querySelectorAll(".attr")) if (a.textContent.includes(`${p.statement}[`)) a.classList.add("hot");
  for (const g of document.querySelectorAll("svg g")) if (g.dataset.node === "p:" + p.node) g.classList.add("hot");
}

function renderSource() {
  const pre = clear($("csource"));
  for (const line of record.c_source.split("\n")) pre.appendChild(el("span", { text: line || " " }));
}

// -- running on random inputs -------------------------------------------------------------
async function run(ev) {
  ev.preventDefault();
  const box = clear($("run"));
  box.appendChild(el("p", { class: "status", text: "running…" }));
  const r = await call("POST", `/v1/kernels/${record.key}/run`, { seed: Number($("seed").value) || 0 });
  clear(box);
  if (!r.ok) { const e = el("div", { class: "error" }); box.appendChild(e); showProblem(e, r.data); return; }
  const outs = r.data.outputs.map((o) => el("tr", {}, el("td", { text: o.name }), el("td", { text: o.type }),
    el("td", { class: "mono", text: o.max_abs_err.toExponential(2) }), el("td", { class: "mono", text: o.max_rel_err.toExponential(2) }),
    el("td", { class: o.ok ? "ok" : "bad", text: o.ok ? "matches the reference" : "MISMATCH" })));
  box.appendChild(el("table", { class: "outputs" }, el("tr", {}, ["output", "type", "max abs err", "max rel err", ""].map((h) => el("th", { text: h }))), outs));
  const ks = r.data.kernels.map((k) => el("tr", {}, el("td", { text: k.name }), el("td", { class: "mono",
    text: k.seconds !== null ? `${(k.seconds * 1e3).toFixed(3)} ms` : `${k.profile.cycles.toLocaleString()} cycles, ${(100 * k.profile.peak_fraction).toFixed(1)}% of peak` })));
  box.appendChild(el("table", { class: "kernel-times" }, el("tr", {}, el("th", { text: "kernel" }), el("th", { text: r.data.profile ? "simulated" : "median time" })), ks));
}

// -- start ----------------------------------------------------------------------------------
async function start() {
  const examples = (await call("GET", "/static/examples.json")).data;
  for (const [i, ex] of examples.entries()) $("example").appendChild(el("option", { value: String(i), text: ex.name }));
  const pickExample = () => { $("graph").value = JSON.stringify(examples[Number($("example").value)].graph, null, 1); };
  $("example").addEventListener("change", pickExample);
  $("upload").addEventListener("change", async () => {
    const f = $("upload").files[0];
    if (!f) return;
    const text = await f.text();
    let graph = null;
    try { graph = JSON.parse(text); } catch (e) { /* shown as sent: the compile says why */ }
    $("graph").value = graph && typeof graph === "object" && Array.isArray(graph.nodes) ? graphText(keptAside(graph)) : text;
  });
  $("compile-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    let graph, options;
    try { graph = putBack(JSON.parse($("graph").value)); options = JSON.parse($("options").value || "{}"); }
    catch (e) { showProblem($("error"), { title: "Not JSON", detail: e.message }); return; }
    compile({ graph, target: $("target").value, options }, $("error"));
  });
  $("fuse-force").addEventListener("click", () => fusionEdit("fuse_force"));
  $("fuse-forbid").addEventListener("click", () => fusionEdit("fuse_forbid"));
  $("run-form").addEventListener("submit", run);
  window.addEventListener("popstate", route);
  await route();
  if (!record) pickExample();
  document.body.dataset.ready = "1";
}

async function route() {
  const m = location.pathname.match(/^\/k\/([0-9a-f]{64})$/);
  if (m) await open(m[1]);
}

start();
