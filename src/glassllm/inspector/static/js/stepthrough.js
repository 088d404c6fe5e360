// stepthrough.js: the Step through tab: one forward pass, one snapshot at a time, in the order the model
// computes them (info.names: embed, each layer's names, the final norm, logits, probs), each shown for one
// position: its row (a query's scores or weights over the keys, a vector's features), with its equation and
// the line of code that computed it. Previous / Next, the ← → keys, or Play. glass.walk holds what is shown.
"use strict";

const Walk = (() => {
  const walk = {index: 0, timer: null};
  const PLAY_MS = 1600;                                   // a readable pace

  function steps() {
    const info = state.info, out = [], L = info.model.n_layers;
    const held = info.names.filter((n) => n.held !== false);
    for (const n of held) if (!n.in_layer && n.name === "embed") out.push({local: n.name, layer: null});
    for (let l = 0; l < L; l++) for (const n of held) if (n.in_layer) out.push({local: n.name, layer: l});
    for (const n of held) if (!n.in_layer && n.name !== "embed") out.push({local: n.name, layer: null});
    return out;
  }

  function build() {
    $("walk-prev").addEventListener("click", () => to(walk.index - 1));
    $("walk-next").addEventListener("click", () => to(walk.index + 1));
    $("walk-play").addEventListener("click", () => (walk.timer ? stop() : play()));
    $("walk-pos").addEventListener("change", () => { state.query = Number($("walk-pos").value); to(walk.index); });
    // ← and → step when the focus is not in a form control (which has its own use for them).
    document.addEventListener("keydown", (e) => {
      if (state.tab !== "walk" || e.altKey || e.ctrlKey || e.metaKey) return;
      if (e.target.closest && e.target.closest("input, select, textarea, [role=radiogroup], [role=tablist]")) return;
      const step = {ArrowRight: 1, ArrowLeft: -1}[e.key];
      if (!step) return;
      e.preventDefault();
      to(walk.index + step);
    });
  }

  function play() {
    if (walk.index >= steps().length - 1) to(0);
    $("walk-play").textContent = "❚❚ Pause"; $("walk-play").setAttribute("aria-pressed", "true");
    walk.timer = setInterval(() => {
      if (walk.index >= steps().length - 1) stop(); else to(walk.index + 1);
    }, PLAY_MS);
  }
  function stop() {
    if (walk.timer) clearInterval(walk.timer);
    walk.timer = null;
    $("walk-play").textContent = "▶ Play"; $("walk-play").setAttribute("aria-pressed", "false");
  }

  // The tab opened: the positions of this prompt, the last one chosen unless one was picked.
  function open() {
    const pos = $("walk-pos");
    pos.replaceChildren(...state.pieces.map((p, i) => el("option", {value: String(i)}, `${i}  ${show(p)}`)));
    if (state.query === null || state.query >= state.pieces.length) state.query = state.pieces.length - 1;
    pos.value = String(state.query);
    return to(walk.index);
  }

  async function to(index) {
    const all = steps();
    walk.index = Math.max(0, Math.min(all.length - 1, index));
    const s = all[walk.index], meta = state.names[s.local];
    const full = (s.layer === null ? "" : `layers.${s.layer}.`) + s.local;
    const head = meta.heads ? Math.min(Controls.rememberedHead(meta.head_axis === "H" ? "H" : "G"), meta.heads - 1) : undefined;
    $("walk-count").textContent = `${walk.index + 1} / ${all.length}`;
    $("walk-prev").disabled = walk.index === 0;
    $("walk-next").disabled = walk.index === all.length - 1;
    $("walk-name").textContent = full + (head === undefined ? "" : ` · ${meta.head_axis === "H" ? "query" : "key/value"} head ${head}`);
    if (meta.explain) Explain.into("walk", meta);
    ModelMap.markStep(s.local, s.layer);
    const body = {prompt: state.prompt, name: s.local};
    if (s.layer !== null) body.layer = s.layer;
    if (head !== undefined) body.head = head;
    const shown = {index: walk.index, total: all.length, name: full, local: s.local, layer: s.layer, head};
    await Api.load("walk", "snapshot", body, {
      error: "walk-error",
      draw: (r) => drawRow(r, meta, shown),
      fail: (message) => { glass.walk = {...shown, position: state.query, row: null, error: message}; },
    });
  }

  // The chosen position's row of snapshot answer ``r``: in words, as a strip of colours, and as numbers.
  function drawRow(r, meta, shown) {
    const info = state.info;
    const data = r.data || Api.decode(r.values), mask = r.masked ? Api.decode(r.masked) : null;
    const [rows, cols] = r.shape;
    const at = r.row_pos && r.row_pos.length ? r.row_pos.indexOf(state.query) : -1;
    const i = at >= 0 ? at : Math.min(state.query, rows - 1);
    const row = Array.from(data.slice(i * cols, (i + 1) * cols));
    const rowMask = mask ? Array.from(mask.slice(i * cols, (i + 1) * cols)) : null;
    const c = info.model;
    const sizes = {n: state.ids.length, m: state.ids.length, H: c.n_heads, G: c.n_kv_heads, D: c.head_dim, C: c.dim,
                   F: c.ffn_dim, V: c.vocab_size};
    $("walk-shape").textContent = `(${meta.axes.map((a) => `${a} = ${sizes[a]}`).join(", ")})`;
    const rowName = r.axes[0] === "m" ? "key" : "query";
    $("walk-what").textContent = cols === 1
      ? `Position ${state.query} (${show(state.pieces[state.query])}): one number, ${fmt(row[0])}.`
      : `Row ${i} of ${rows}: the ${rowName} at position ${r.row_pos ? r.row_pos[i] : i} ` +
        `(${show(state.pieces[r.row_pos ? r.row_pos[i] : i])}), ${cols} values` +
        (r.col_kind === "token" ? ", one per key" : r.col_kind === "vocab" ? ", one per vocabulary id" : "") +
        (rowMask && rowMask.some(Boolean) ? `; ${rowMask.filter(Boolean).length} future keys masked (·)` : "") + ".";
    const sc = Paint.scaleFor(r, data, mask);
    const strip = $("walk-strip"), W = Math.max(200, strip.clientWidth || 600);
    strip.width = W; strip.height = 28;
    const g = strip.getContext("2d");
    g.imageSmoothingEnabled = false;
    g.clearRect(0, 0, W, 28);
    g.drawImage(Paint.cellsImage(row, rowMask, 1, cols, sc), 0, 0, W, 28);
    const label = (j) => r.col_kind === "token" ? `${show(r.cols[j])} ` : r.col_kind === "vocab" ? `${show(info.vocab[j])} ` : "";
    const count = Math.min(cols, 48);
    $("walk-values").textContent = row.slice(0, count).map((v, j) => `${label(j)}${rowMask && rowMask[j] ? "·" : fmt(v, 3)}`)
      .join("  ") + (cols > count ? `  … (${cols - count} more)` : "");
    glass.walk = {...shown, position: state.query, row, rowIndex: i, masked: rowMask, shape: r.shape, axes: r.axes,
                  equation: meta.explain ? meta.explain.equation.text : null,
                  line: meta.explain ? meta.explain.line : null, playing: !!walk.timer};
  }

  return {build, open, to, redraw: () => to(walk.index), stop};
})();
