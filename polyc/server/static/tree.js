// Schedule trees (the JSON of schedule_tree.tree.schedule_to_json): a collapsible view,
// the same tree as indented text lines, and a line diff between two passes.
import { el } from "./dom.js";

const SHOWN = ["domain", "filter", "schedule", "mark", "members", "permutable", "coincident",
               "extension", "context", "expansion", "contraction"];
const MAX_OPEN_DEPTH = 3; // deeper nodes start collapsed: a huge tree renders at once

// the copy statements the chip targets add (lower.copy_statement): copy_in_<buffer>
const COPY = /\bcopy_(in|out)_([A-Za-z0-9_]+)\[/g;
const COPY_WORD = { manycore: { in: "DMA get", out: "DMA put" }, npu: { in: "copy in", out: "copy out" } };

function copies(node) {
  return node.kind === "filter" && node.filter ? [...node.filter.matchAll(COPY)] : [];
}

// a copy_in of a buffer the tile only writes moves nothing: it places the tile's box
// (the targets' builders skip its transfer)
function moves(dir, p) {
  return !p || (dir === "in" ? p.direction === "in" : p.direction === "out") || p.direction === "inout";
}

// ctx: { promoted: the kernel's buffers (record.kernels[i].promoted), target }
function label(node, ctx) {
  const kind = node.kind || "node";
  const found = copies(node);
  if (found.length) {
    const words = COPY_WORD[ctx.target] || { in: "copy in", out: "copy out" };
    const dir = found[0][1];
    const moving = found.some(([, , b]) => moves(dir, ctx.promoted.find((p) => p.buffer === b)));
    return [el("span", { class: "kind copy", text: moving ? words[dir] : "place tile" }), el("span", { text: ` ${found.map((m) => m[2]).join(", ")}` })];
  }
  const tile = kind === "mark" && /^tile (\S+) (\S+)$/.exec(node.mark || "");
  if (tile) {
    const here = ctx.promoted.filter((p) => p.at === node.mark).map((p) => p.buffer);
    return [el("span", { class: "kind level-mark", text: `tile ${tile[1]}` }), el("span", { text: ` ${tile[2]}${here.length ? `: one tile of ${here.join(", ")} at a time` : ""}` })];
  }
  const extra = node.mark ? ` ${node.mark}` : node.kind === "band" ? ` (${node.members} member${node.members === 1 ? "" : "s"}${node.permutable ? ", permutable" : ""})` : "";
  return [el("span", { class: "kind", text: kind }), el("span", { text: extra })];
}

// a copy node: each buffer it fills or drains, its level, shape and size
function copyLines(node, ctx) {
  return copies(node).map(([, dir, buffer]) => {
    const p = ctx.promoted.find((b) => b.buffer === buffer);
    const what = !moves(dir, p) ? ": placed here, nothing to move (the tile writes it)" : ` ${dir === "in" ? "<-" : "->"} ${p.array}`;
    const text = p ? `${buffer} [${p.level}] ${p.shape.join("x")} (${p.bytes.toLocaleString()} B)${what}` : buffer;
    return el("span", { class: `attr copy-line level-${p ? p.level : ""}`, text });
  });
}

// the chip targets' copies sit deep (below their tile's mark): the path to them starts open
const toCopy = new WeakMap();
function leadsToCopy(node) {
  if (!toCopy.has(node)) toCopy.set(node, copies(node).length > 0 || (node.children || []).some(leadsToCopy));
  return toCopy.get(node);
}

export function treeView(node, ctx = { promoted: [], target: "" }, depth = 0) {
  const box = el("details", { "data-kind": node.kind || "" });
  if (copies(node).length) box.classList.add("copy-node");
  if (depth < MAX_OPEN_DEPTH || (ctx.promoted.length && leadsToCopy(node))) box.open = true;
  box.appendChild(el("summary", {}, label(node, ctx)));
  for (const key of SHOWN) {
    if (key in node && key !== "members") {
      box.appendChild(el("span", { class: "attr", text: `${key}: ${JSON.stringify(node[key])}` }));
    }
  }
  for (const line of copyLines(node, ctx)) box.appendChild(line);
  const children = node.children || [];
  // children are built when first opened: a tree of thousands of nodes costs nothing
  // until someone looks
  let built = false;
  const build = () => {
    if (built) return;
    built = true;
    for (const child of children) box.appendChild(treeView(child, ctx, depth + 1));
  };
  if (box.open) build(); else box.addEventListener("toggle", build);
  return el("div", { class: "tree" }, box);
}

export function treeLines(node, indent = "") {
  const head = [node.kind];
  for (const key of SHOWN) if (key in node) head.push(`${key}: ${JSON.stringify(node[key])}`);
  const lines = [indent + head.join("  ")];
  for (const child of node.children || []) lines.push(...treeLines(child, indent + "  "));
  return lines;
}

// Longest common subsequence of lines; trees are small enough (hundreds of lines) for
// the quadratic table, and a cap keeps a huge one from freezing the tab.
export function diffLines(a, b) {
  if (a.length * b.length > 4e6) return null;
  const n = a.length, m = b.length;
  const t = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
    t[i][j] = a[i] === b[j] ? t[i + 1][j + 1] + 1 : Math.max(t[i + 1][j], t[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { out.push(["same", a[i]]); i++; j++; }
    else if (j < m && (i === n || t[i][j + 1] >= t[i + 1][j])) out.push(["add", b[j++]]);
    else out.push(["del", a[i++]]);
  }
  return out;
}
