// Pictures of the graph as sent (a composite op opens, on a click, into the primitives
// it was decomposed into) and after decomposition (primitive nodes boxed by kernel),
// drawn as SVG from the record: boxes in layers, edges along the tensors.
import { el, svg } from "./dom.js";

const W = 150, H = 34, GAP_X = 40, GAP_Y = 14;
const MAX_DRAWN = 400; // past this a picture helps nobody and costs the tab

function layers(items, deps) {
  // longest path from the sources: each item one layer right of what it reads
  const depth = new Map();
  const visit = (id, seen = new Set()) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;
    seen.add(id);
    const d = Math.max(-1, ...(deps.get(id) || []).map((p) => visit(p, seen))) + 1;
    depth.set(id, d);
    return d;
  };
  items.forEach((it) => visit(it.id));
  return depth;
}

// groups: [label, ids, class, onclick] boxes drawn around their items
function draw(title, items, deps, groups = []) {
  const depth = layers(items, deps);
  const rows = new Map();
  const pos = new Map();
  for (const it of items) {
    const d = depth.get(it.id);
    const r = rows.get(d) || 0;
    rows.set(d, r + 1);
    pos.set(it.id, { x: 10 + d * (W + GAP_X), y: 28 + r * (H + GAP_Y) });
  }
  const width = 20 + (Math.max(0, ...depth.values()) + 1) * (W + GAP_X);
  const height = 40 + Math.max(1, ...rows.values()) * (H + GAP_Y);
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  root.appendChild(svg("text", { x: 10, y: 16 }, title));
  for (const [id, ps] of deps) for (const p of ps) {
    const a = pos.get(p), b = pos.get(id);
    if (!a || !b) continue;
    root.appendChild(svg("path", { class: "edge", "data-from": p, "data-to": id, d: `M${a.x + W},${a.y + H / 2} C${a.x + W + GAP_X / 2},${a.y + H / 2} ${b.x - GAP_X / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}` }));
  }
  for (const [name, ids, cls, onclick] of groups) {
    const ps = ids.map((id) => pos.get(id)).filter(Boolean);
    if (!ps.length) continue;
    const x0 = Math.min(...ps.map((p) => p.x)) - 4, y0 = Math.min(...ps.map((p) => p.y)) - 4;
    const x1 = Math.max(...ps.map((p) => p.x)) + W + 4, y1 = Math.max(...ps.map((p) => p.y)) + H + 4;
    const g = svg("g", { class: cls, "data-group": name });
    g.appendChild(svg("rect", { x: x0, y: y0, width: x1 - x0, height: y1 - y0 }));
    g.appendChild(svg("text", { x: x0 + 2, y: y1 + 11 }, name));
    if (onclick) g.addEventListener("click", onclick);
    root.appendChild(g);
  }
  for (const it of items) {
    const p = pos.get(it.id);
    const g = svg("g", { class: it.kind, "data-node": it.id });
    g.appendChild(svg("title", {}, it.title || it.label));
    g.appendChild(svg("rect", { x: p.x, y: p.y, width: W, height: H, rx: 4 }));
    g.appendChild(svg("text", { x: p.x + 5, y: p.y + 14 }, it.label.slice(0, 22)));
    g.appendChild(svg("text", { x: p.x + 5, y: p.y + 27 }, (it.sub || "").slice(0, 22)));
    if (it.onclick) g.addEventListener("click", it.onclick);
    root.appendChild(g);
  }
  return root;
}

function tooMany(title, n, what) {
  return el("p", { class: "hint too-many", text: `${title}: ${n} nodes, too many to draw; ${what}` });
}

// Every primitive node of the record once: its composite (origin), kernel, statement,
// what it reads and writes. The primitives are what the kernels compute, from provenance.
function primitives(record) {
  const prims = new Map(), writer = new Map();
  for (const k of record.kernels) (k.provenance || []).forEach((p, i) => {
    if (!p.node) return;
    const id = "p:" + p.node;
    const prim = prims.get(id) || { id, node: p.node, origin: p.origin, kernel: k.name, reads: new Set(), writes: new Set() };
    for (const t of p.reads) prim.reads.add(t);
    prim.writes.add(p.writes);
    prim.statement = k.statements[i]; // the last: a reduction's update, after its init
    prims.set(id, prim);
    writer.set(p.writes, id);
  });
  return { prims, writer };
}

// a statement's right-hand side, short: what a primitive computes, under its name
// ("S0: n.sum[i0, i1] += x[i0, i1]  for ..." -> "+= x[i0, i1]")
const rhs = (statement) => (statement || "").replace(/^[^=]*?(\S*)=\s*/, (_, op) => (op ? `${op}= ` : "")).replace(/\s+for .*$/, "");

function sentPicture(record, prims, writer) {
  const g = record.graph;
  const shapes = new Map([...(g.inputs || []), ...(g.constants || [])].map((t) => [t.name, `[${t.shape.join(", ")}]`]));
  const tensors = new Set(shapes.keys());
  const nodes = g.nodes.map((n) => ({ n, name: n.name || n.outputs[0] }));
  if (nodes.length + tensors.size > MAX_DRAWN) return tooMany("as sent", nodes.length, "the kernels below list them");
  const producer = new Map(nodes.map(({ n, name }) => [n.outputs[0], "n:" + name]));
  const members = new Map(), owner = new Map(); // sent node id <-> its primitives
  for (const { n, name } of nodes) {
    const ps = [...prims.values()].filter((p) => p.origin === `${n.op} '${name}'`);
    members.set("n:" + name, ps);
    for (const p of ps) owner.set(p.id, "n:" + name);
  }
  const opens = (id) => { const ps = members.get(id) || []; return ps.length > 1 || (ps.length === 1 && "n:" + ps[0].node !== id); };
  const expanded = new Set();
  const box = el("div", { class: "sent" });

  // where an edge for `tensor` read by sent node `reader` starts: the sent node that made
  // it, or when that one is open, the primitive writing it, else (the tensor was inlined
  // into its readers) those of its primitives the reader's primitives read, else its last
  const sinks = (id) => {
    const ps = members.get(id);
    return ps.filter((p) => !ps.some((q) => q !== p && [...p.writes].some((t) => q.reads.has(t)))).map((p) => p.id);
  };
  const source = (tensor, reader) => {
    if (tensors.has(tensor)) return ["t:" + tensor];
    const w = writer.get(tensor), sent = producer.get(tensor) || (w && owner.get(w));
    if (!sent) return [];
    if (!expanded.has(sent)) return [sent];
    if (w && owner.get(w) === sent) return [w];
    const read = (members.get(reader) || []).flatMap((p) => [...p.reads]).map((t) => writer.get(t))
      .filter((x) => x && owner.get(x) === sent);
    return read.length ? [...new Set(read)] : sinks(sent);
  };

  const redraw = () => {
    const items = [...tensors].map((t) => ({ id: "t:" + t, label: t, sub: shapes.get(t), kind: "tensor" }));
    const deps = new Map(), groups = [];
    for (const { n, name } of nodes) {
      const id = "n:" + name;
      if (expanded.has(id)) {
        const ps = members.get(id);
        for (const p of ps) {
          items.push({ id: p.id, label: p.node, sub: rhs(p.statement), title: `${p.statement}\n(in ${p.kernel})`, kind: "node primitive" });
          deps.set(p.id, [...new Set([...p.reads].flatMap((t) => writer.get(t) === p.id ? [] : source(t, id)))]);
        }
        groups.push([`${n.op} ${name} (click to close)`, ps.map((p) => p.id), "composite-box", () => toggle(id)]);
      } else {
        const can = opens(id);
        items.push({ id, label: name, sub: can ? `${n.op} ▸ ${members.get(id).length} primitives` : n.op, title: `${n.op} ${name}${can ? " (click to open)" : ""}`,
          kind: can ? "node composite" : "node", onclick: can ? () => toggle(id) : null });
        deps.set(id, [...new Set(n.inputs.flatMap((t) => source(t, id)))]);
      }
    }
    box.replaceChildren(draw("as sent", items, deps, groups));
  };
  const toggle = (id) => { if (expanded.has(id)) expanded.delete(id); else expanded.add(id); redraw(); };
  const composites = nodes.map(({ name }) => "n:" + name).filter(opens);
  const controls = el("div", { class: "edit" }, composites.length
    ? [el("span", { class: "hint", text: `${composites.length} composite op(s): click one to open it into its primitives` }),
      el("button", { type: "button", class: "open-all", text: "Open all", onclick: () => { composites.forEach((c) => expanded.add(c)); redraw(); } }),
      el("button", { type: "button", class: "close-all", text: "Close all", onclick: () => { expanded.clear(); redraw(); } })]
    : el("span", { class: "hint", text: "no composite ops" }));
  redraw();
  return el("div", {}, controls, box);
}

function primitivePicture(record, prims, writer) {
  const deps = new Map(), inputs = new Set();
  for (const p of prims.values()) {
    const ds = new Set();
    for (const t of p.reads) {
      const src = writer.get(t) || "t:" + t;
      if (src === p.id) continue;
      if (!writer.has(t)) inputs.add(t);
      ds.add(src);
    }
    deps.set(p.id, [...ds]);
  }
  const items = [...[...inputs].map((t) => ({ id: "t:" + t, label: t, sub: "input", kind: "tensor" })),
    ...[...prims.values()].map((p) => ({ id: p.id, label: p.node, sub: p.origin, title: `${p.node} from ${p.origin}`, kind: "node" }))];
  if (items.length <= MAX_DRAWN) {
    const groups = record.kernels.map((k) => [k.name, [...prims.values()].filter((p) => p.kernel === k.name).map((p) => p.id), "kernel"]);
    return draw("after decomposition, by kernel", items, deps, groups);
  }
  // collapsed: one box per kernel, an edge where one kernel reads what another wrote
  if (record.kernels.length > MAX_DRAWN) return tooMany("after decomposition", prims.size, "the kernels below list them");
  const kernelOf = (id) => (prims.has(id) ? "k:" + prims.get(id).kernel : id);
  const kdeps = new Map(record.kernels.map((k) => ["k:" + k.name, new Set()]));
  for (const [id, ds] of deps) for (const d of ds) if (kernelOf(d) !== kernelOf(id)) kdeps.get(kernelOf(id)).add(kernelOf(d));
  const kitems = [...[...inputs].map((t) => ({ id: "t:" + t, label: t, sub: "input", kind: "tensor" })),
    ...record.kernels.map((k) => ({ id: "k:" + k.name, label: k.name, sub: `${k.nodes.length} primitive nodes`, kind: "node kernel-node",
      title: `${k.name}: ${k.nodes.length} nodes (click to open it below)`, onclick: () => openKernel(k.name) }))];
  const picture = draw(`after decomposition: ${prims.size} primitive nodes, collapsed into their ${record.kernels.length} kernels`,
    kitems, new Map([...kdeps].map(([k, s]) => [k, [...s]])));
  picture.classList.add("collapsed");
  return picture;
}

export function openKernel(name) {
  const view = [...document.querySelectorAll("details.kernel")].find((d) => d.dataset.kernel === name);
  if (!view) return;
  view.open = true;
  view.scrollIntoView({ block: "start" });
}

export function graphPictures(record) {
  const { prims, writer } = primitives(record);
  return [sentPicture(record, prims, writer), primitivePicture(record, prims, writer)];
}
