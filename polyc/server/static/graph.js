// Pictures of the graph as sent and after decomposition (primitive nodes by kernel),
// drawn as SVG from the record: boxes in layers, edges along the tensors.
import { el, svg } from "./dom.js";

const W = 150, H = 34, GAP_X = 40, GAP_Y = 14;
const MAX_DRAWN = 400; // past this a picture helps nobody and costs the tab: list instead

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

function draw(title, items, deps, groups) {
  if (items.length > MAX_DRAWN) {
    return el("p", { class: "hint", text: `${title}: ${items.length} nodes, too many to draw; the kernels below list them` });
  }
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
    root.appendChild(svg("path", { class: "edge", d: `M${a.x + W},${a.y + H / 2} C${a.x + W + GAP_X / 2},${a.y + H / 2} ${b.x - GAP_X / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}` }));
  }
  for (const [name, ids] of groups || []) {
    const ps = ids.map((id) => pos.get(id)).filter(Boolean);
    if (!ps.length) continue;
    const x0 = Math.min(...ps.map((p) => p.x)) - 4, y0 = Math.min(...ps.map((p) => p.y)) - 4;
    const x1 = Math.max(...ps.map((p) => p.x)) + W + 4, y1 = Math.max(...ps.map((p) => p.y)) + H + 4;
    root.appendChild(svg("rect", { class: "kernel", x: x0, y: y0, width: x1 - x0, height: y1 - y0 }));
    root.appendChild(svg("text", { x: x0 + 2, y: y1 + 11 }, name));
  }
  for (const it of items) {
    const p = pos.get(it.id);
    const g = svg("g", { class: it.tensor ? "tensor" : "node", "data-node": it.id });
    g.appendChild(svg("title", {}, it.title || it.label));
    g.appendChild(svg("rect", { x: p.x, y: p.y, width: W, height: H, rx: 4 }));
    g.appendChild(svg("text", { x: p.x + 5, y: p.y + 14 }, it.label.slice(0, 22)));
    g.appendChild(svg("text", { x: p.x + 5, y: p.y + 27 }, (it.sub || "").slice(0, 22)));
    root.appendChild(g);
  }
  return root;
}

export function graphPictures(record) {
  const g = record.graph;
  const producer = new Map();
  const items = [], deps = new Map();
  for (const t of [...(g.inputs || []), ...(g.constants || [])]) {
    items.push({ id: "t:" + t.name, label: t.name, sub: `[${t.shape.join(", ")}]`, tensor: true });
    producer.set(t.name, "t:" + t.name);
  }
  for (const n of g.nodes) {
    const name = n.name || n.outputs[0];
    producer.set(n.outputs[0], "n:" + name);
  }
  for (const n of g.nodes) {
    const name = n.name || n.outputs[0];
    items.push({ id: "n:" + name, label: name, sub: n.op, title: `${n.op} ${name}` });
    deps.set("n:" + name, n.inputs.map((t) => producer.get(t)).filter(Boolean));
  }
  const before = draw("as sent", items, deps);

  // after decomposition: each primitive node once, with what it reads, boxed by kernel
  const prim = new Map(), pdeps = new Map(), groups = [];
  const writer = new Map();
  for (const k of record.kernels) for (const p of k.provenance || []) if (p.node) writer.set(p.writes, "p:" + p.node);
  const inputs = new Set();
  for (const k of record.kernels) {
    const ids = [];
    for (const p of k.provenance || []) {
      if (!p.node) continue;
      const id = "p:" + p.node;
      if (!prim.has(id)) prim.set(id, { id, label: p.node, sub: p.origin, title: `${p.node} from ${p.origin}` });
      ids.push(id);
      const ds = new Set(pdeps.get(id) || []);
      for (const t of p.reads) {
        const src = writer.get(t) || "t:" + t;
        if (src === id) continue;
        if (!writer.has(t)) inputs.add(t);
        ds.add(src);
      }
      pdeps.set(id, [...ds]);
    }
    groups.push([k.name, [...new Set(ids)]]);
  }
  const pitems = [...[...inputs].map((t) => ({ id: "t:" + t, label: t, sub: "input", tensor: true })), ...prim.values()];
  const after = draw("after decomposition, by kernel", pitems, pdeps, groups);
  return [before, after];
}
