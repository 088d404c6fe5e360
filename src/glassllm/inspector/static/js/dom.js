// dom.js: the small helpers every other script uses: finding and making elements, and writing numbers
// and token pieces as the page shows them.
//
// The page's scripts are plain scripts run in one fixed order (glassllm.inspector.assets.SCRIPTS), with no
// build step: each defines one name (these helpers, `state`, or a feature's object such as `Heatmap`), and
// later scripts use the names of earlier ones.
"use strict";

const $ = (id) => document.getElementById(id);

const el = (tag, attrs = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  if (text !== undefined) e.textContent = text;
  return e;
};

// A token piece, made visible: spaces as ␣, nothing else changed.
const show = (piece) => piece.replace(/ /g, "␣");

const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

const fmt = (v, d = 4) => {
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(d - 1);
  return v.toFixed(d);
};

const nice = (n) => n.toLocaleString("en-US");

const plural = (n, noun, many = noun + "s") => `${n} ${n === 1 ? noun : many}`;

// A number at the precision of the dtype it was computed in: float32 values are shown with the fewest
// digits that read back as the same float32 (at most 9), float64 ones with JavaScript's shortest (at most 17).
const precise = (v, dtype) => {
  if (dtype !== "float32" || !Number.isFinite(v)) return String(v);
  for (let p = 1; p < 9; p++) {
    const s = v.toPrecision(p);
    if (Math.fround(Number(s)) === v) return String(Number(s));
  }
  return String(Number(v.toPrecision(9)));
};

// The column headings of a list of bars (next token, before / after, the timeline's guess), in the bars' own grid.
const barColumns = (piece, track, p, q) => {
  const li = el("li", {class: "cols small muted"});
  li.append(el("span"), el("span", {}, piece), el("span", {}, track), el("span", {class: "p"}, p),
            el("span", {class: "q"}, q));
  return li;
};
