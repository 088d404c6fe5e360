// heatmap.js: the heatmap of the chosen snapshot: asking for it, drawing it (cells, masks, labels, row sums),
// its legend and its heading; a view that cannot be had greys out the previous one and says why.
"use strict";

const Heatmap = (() => {
  const AXIS_NAMES = {
    n: "query position", m: "key position", C: "feature (C)", D: "head feature (D)", F: "MLP unit (F)",
    V: "vocabulary id (V)", "": "",
  };

  // The snapshot request of the current choice.
  function body() {
    const meta = state.names[state.name];
    const out = {prompt: state.prompt, name: state.name};
    if (meta.in_layer) out.layer = state.layer;
    if (meta.heads) out.head = state.head;
    if (state.step) out.step = state.step;
    if (state.grad && !state.step) out.grad = true;
    if (state.grad && !state.step && state.target !== null) out.target = state.target;
    if (state.intervention && !state.step) out.intervention = state.intervention;
    return out;
  }

  async function load() {
    if (!state.prompt) return;
    const asked = body();
    await Api.load("view", "snapshot", asked, {
      error: "view-error",
      draw: async (r, isNewest) => {
        state.snapshot = r;
        r.data = r.data || Api.decode(r.values);
        r.mask = r.masked ? (r.mask || Api.decode(r.masked)) : null;
        $("heatmap-wrap").classList.remove("stale");
        draw();
        await Compare.update(asked, isNewest);
      },
      fail: () => stale(asked),
    });
    if (state.tab === "heads") await Grid.load();           // the grid follows value/gradient, prompt, intervention
  }

  // The view ``asked`` for cannot be had: the heatmap and its heading would describe the previous view, so
  // say so and grey it out; nothing below may go on describing the previous view as if it were this one.
  function stale(asked) {
    const kv = /^attn\.(k|v|rope_k|cache_k|cache_v)$/.test(asked.name);
    $("view-name").textContent = `${asked.layer !== undefined ? `layers.${asked.layer}.` : ""}${asked.name}` +
      `${asked.head !== undefined ? ` · ${kv ? "key/value" : "query"} head ${asked.head}` : ""}: not shown`;
    $("view-shape").textContent = "the greyed-out heatmap below is the previous view";
    $("heatmap-wrap").classList.add("stale");
    Cells.hide();
    state.cell = null;
    Cells.clearReadout();
    $("rowsum-line").textContent = "";
    $("howto-text").replaceChildren(el("p", {}, "No view to read: see the message above."));
    $("compare").hidden = true;
    glass.compare = null;
    Interventions.updateEditButton();
  }

  // Where the drawing goes, for snapshot answer ``r`` in a frame ``wrapW`` CSS pixels wide: cell sizes and
  // the margins for labels (and, for attention weights, the row sums on the right).
  function layout(r, rows, cols, wrapW, canvas) {
    const W = Math.max(320, wrapW - 2);
    const tokenCols = r.col_kind === "token";
    const isSoftmax = r.local === "attn.softmax" && !r.grad;
    const rowLabelW = 112, rightW = isSoftmax ? 78 : 12;
    const topH = tokenCols ? 74 : 34, bottomH = 24;
    const availW = W - rowLabelW - rightW;
    const top = canvas.getBoundingClientRect().top + window.scrollY;     // from the page's top
    const maxH = Math.max(200, Math.min(640, window.innerHeight - Math.min(top, 420) - 190));
    let cw, ch;
    if (tokenCols) {
      cw = Math.max(1, Math.min(40, Math.floor(availW / cols)));
      ch = Math.max(1, Math.min(cw, 40, Math.floor(maxH / rows)));
      if (rows === 1) ch = Math.max(ch, 28);
    } else {
      // At least one pixel per column, so the mouse can reach every one of 1,024 vocabulary ids
      // (a wider grid scrolls sideways in its frame).
      cw = Math.floor(Math.max(1, Math.min(40, availW / cols)));
      ch = Math.max(2, Math.min(26, Math.floor(maxH / rows)));
    }
    const gridW = cw * cols, gridH = ch * rows;
    return {tokenCols, isSoftmax, rows, cols, cw, ch, x0: rowLabelW, y0: topH, gridW, gridH,
            cssW: rowLabelW + gridW + rightW + 8, cssH: topH + gridH + bottomH,
            fs: Math.max(9, Math.min(13, ch - 2)), rowStep: Math.max(1, Math.ceil(12 / ch))};
  }

  function draw() {
    const t0 = performance.now();
    Cells.hide();
    const r = state.snapshot, data = r.data, mask = r.mask;
    const [rows, cols] = r.shape;
    if (!state.layout || state.layout.rows !== rows || state.layout.cols !== cols) state.cell = null;
    const canvas = $("heatmap");
    const wrapW = $("heatmap-wrap").clientWidth;                // read once: reading it after a resize forces a layout
    const at = layout(r, rows, cols, wrapW, canvas);
    const {x0, y0, cw, ch, cssW, cssH} = at;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * dpr); canvas.height = Math.round(cssH * dpr);
    canvas.style.width = cssW + "px"; canvas.style.height = cssH + "px";
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, cssW, cssH);

    const sc = Paint.scaleFor(r, data, mask);
    drawCells(g, r, at, sc);
    const {queryRow, queryCol} = drawQuery(g, r, at);
    drawCacheMarks(g, r, at);
    drawLabels(g, r, at);
    const sums = at.isSoftmax ? drawRowSums(g, r, at) : [];
    if (!at.isSoftmax) $("rowsum-line").textContent = "";
    stickyRows(canvas, at, wrapW, dpr);

    state.layout = {x0, y0, cw, ch, rows, cols};
    // A cell picked before is read again in this view; otherwise the line must not keep describing a cell
    // of the previous view (it is a live region: a screen reader would announce a number that is not here).
    if (state.cell) Cells.showReadout(state.cell.i, state.cell.j);
    else Cells.clearReadout();
    Interventions.updateEditButton();
    glass.heatmap = {
      name: r.name, local: r.local, layer: r.layer, head: r.head, grad: r.grad, step: r.step,
      rows, cols, n: r.n, m: r.m, start: r.start, axes: r.axes, values: data, masked: mask,
      rowLabels: r.rows, colLabels: r.cols, rowSums: sums, scale: sc, queryRow, queryCol, cssWidth: cssW,
      cellWidth: cw, cellHeight: ch, wrapWidth: wrapW,
      value: (i, j) => data[i * cols + j],
      // The centre of cell (i, j) in CSS pixels from the canvas's top-left corner, for hovering.
      cellCenter: (i, j) => ({x: x0 + (j + 0.5) * cw, y: y0 + (i + 0.5) * ch}),
    };
    canvas.dataset.rows = String(rows); canvas.dataset.cols = String(cols);
    canvas.dataset.n = String(r.n); canvas.dataset.m = String(r.m); canvas.dataset.name = r.name;

    drawLegend(sc, r, mask);
    describe(r, sc);
    state.rendered++;
    glass.lastRenderMs = performance.now() - t0;
  }

  // The cells: one pixel per value, scaled up without smoothing; masked cells hatched, so that "forbidden"
  // never looks like "small"; cell borders when cells are large enough to read one by one; the frame.
  function drawCells(g, r, {x0, y0, cw, ch, rows, cols, gridW, gridH}, sc) {
    g.imageSmoothingEnabled = false;
    g.drawImage(Paint.cellsImage(r.data, r.mask, rows, cols, sc), x0, y0, gridW, gridH);
    if (r.mask && cw >= 3 && ch >= 3) Paint.hatch(g, r.mask, rows, cols, x0, y0, cw, ch);
    if (cw >= 14 && ch >= 14) {
      g.strokeStyle = "rgba(255,255,255,0.7)"; g.lineWidth = 1;
      g.beginPath();
      for (let j = 1; j < cols; j++) { g.moveTo(x0 + j * cw + 0.5, y0); g.lineTo(x0 + j * cw + 0.5, y0 + gridH); }
      for (let i = 1; i < rows; i++) { g.moveTo(x0, y0 + i * ch + 0.5); g.lineTo(x0 + gridW, y0 + i * ch + 0.5); }
      g.stroke();
    }
    g.strokeStyle = "#9a9485"; g.lineWidth = 1; g.strokeRect(x0 - 0.5, y0 - 0.5, gridW + 1, gridH + 1);
  }

  // The position picked with a token chip: its query row and, where columns are positions, its key column.
  function drawQuery(g, r, {x0, y0, cw, ch, cols, gridW, gridH, tokenCols}) {
    const queryRow = state.query === null || !r.row_pos ? -1 : r.row_pos.indexOf(state.query);
    const queryCol = state.query !== null && tokenCols && state.query < cols ? state.query : -1;
    g.strokeStyle = "#e8871e"; g.lineWidth = 2;
    if (queryRow >= 0) g.strokeRect(x0 - 1, y0 + queryRow * ch - 1, gridW + 2, ch + 2);
    if (queryCol >= 0) g.strokeRect(x0 + queryCol * cw - 1, y0 - 1, cw + 2, gridH + 2);
    g.lineWidth = 1;
    return {queryRow, queryCol};
  }

  // KV cache: which keys were cached and which are new (decoding steps).
  function drawCacheMarks(g, r, {x0, y0, cw, cols}) {
    const stepMode = r.step > 0 && (r.axes[0] === "m" || r.axes[1] === "m");
    if (stepMode && r.axes[1] === "m") {
      for (let j = 0; j < cols; j++) {
        g.fillStyle = j < r.start ? "#b9b3a4" : "#e8871e";
        g.fillRect(x0 + j * cw, y0 - 7, Math.max(cw - (cw > 3 ? 1 : 0), 1), 5);
      }
    }
  }

  // Labels: rows (left), columns (top), axis captions.
  function drawLabels(g, r, {x0, y0, cw, ch, rows, cols, gridW, cssH, tokenCols, fs, rowStep}) {
    g.fillStyle = "#2b2a27"; g.textBaseline = "middle";
    g.font = `${fs}px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace`;
    g.textAlign = "right";
    for (let i = 0; i < rows; i += rowStep) {
      const y = y0 + i * ch + ch / 2;
      let label;
      if (r.rows.length) {
        const p = clip(show(r.rows[i]), 9);
        label = ch >= 9 ? `${p} ${r.row_pos[i]}` : String(r.row_pos[i]);
      } else label = String(i);
      g.fillText(label, x0 - 6, y);
    }
    g.textAlign = "left";
    g.font = `11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace`;
    if (tokenCols) {
      const colStep = Math.max(1, Math.ceil(12 / cw));
      for (let j = 0; j < cols; j += colStep) {
        g.save();
        g.translate(x0 + j * cw + cw / 2 + 3, y0 - 10);
        g.rotate(-Math.PI / 3);
        g.fillText(cw >= 9 ? `${clip(show(r.cols[j]), 8)} ${j}` : String(j), 0, 0);
        g.restore();
      }
    } else if (r.col_kind !== "none") {
      const every = niceStep(cols, gridW);
      g.textAlign = "center";
      for (let j = 0; j < cols; j += every) g.fillText(String(j), x0 + j * cw + cw / 2, y0 - 9);
    }
    g.font = "600 12px system-ui, sans-serif"; g.fillStyle = "#6b5f45";
    const rowName = r.axes[0] === "n" && !tokenCols ? "position" : (AXIS_NAMES[r.axes[0]] || r.axes[0]);
    const colName = AXIS_NAMES[r.axes[1]] ?? r.axes[1];
    g.textAlign = "left";
    const rowCaption = tokenCols ? "query ↓" : `${rowName} ↓`;
    g.fillText(rowCaption, 4, 12);
    if (colName) {
      g.textAlign = "right";
      g.fillText(tokenCols ? "key →" : `${colName} →`, x0 + gridW, cssH - 9);
    }
  }

  // Row sums of the attention weights, on the right, and how far the worst is from 1 (below the heatmap).
  function drawRowSums(g, r, {x0, y0, ch, rows, cols, gridW, fs, rowStep}) {
    const data = r.data, sums = [];
    for (let i = 0; i < rows; i++) {
      let s = 0;
      for (let j = 0; j < cols; j++) s += data[i * cols + j];
      sums.push(s);
    }
    g.textAlign = "left"; g.fillStyle = "#6b5f45"; g.font = "600 12px system-ui, sans-serif";
    g.fillText("Σ row", x0 + gridW + 10, y0 - 10);
    g.font = `${Math.min(11, fs)}px ui-monospace, monospace`; g.fillStyle = "#2b2a27";
    for (let i = 0; i < rows; i += rowStep) g.fillText(sums[i].toFixed(6), x0 + gridW + 10, y0 + i * ch + ch / 2);
    let worst = 0;
    for (const s of sums) worst = Math.max(worst, Math.abs(s - 1));
    // float32 rounding leaves |Σ row − 1| near 1e-7; far more means the weights were set by hand (an edit).
    $("rowsum-line").textContent = worst < 1e-4
      ? `Every row sums to 1 up to rounding: the largest |Σ row − 1| is ${worst.toExponential(2)}.`
      : `Not every row sums to 1: the largest |Σ row − 1| is ${worst.toExponential(2)}, because an ` +
        "intervention set these weights after the softmax.";
    return sums;
  }

  // The row labels again, on a strip that stays in place when a wide grid scrolls sideways.
  function stickyRows(canvas, {x0, cssW, cssH}, wrapW, dpr) {
    const strip = $("heatmap-rows"), wide = cssW > wrapW;
    strip.hidden = !wide;
    canvas.style.marginLeft = wide ? -x0 + "px" : "0";
    if (wide) {
      strip.width = Math.round(x0 * dpr); strip.height = canvas.height;
      strip.style.width = x0 + "px"; strip.style.height = cssH + "px";
      const sg = strip.getContext("2d");
      sg.fillStyle = "#fffdf8"; sg.fillRect(0, 0, strip.width, strip.height);
      sg.drawImage(canvas, 0, 0, strip.width, strip.height, 0, 0, strip.width, strip.height);
    }
  }

  function niceStep(cols, width) {
    const target = Math.max(1, Math.ceil(cols / Math.max(1, width / 48)));
    for (const s of [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]) if (s >= target) return s;
    return 1024;
  }

  function drawLegend(sc, r, mask) {
    Paint.scaleBar($("legend-bar"), sc);
    $("legend-lo").textContent = fmt(sc.lo);
    $("legend-hi").textContent = fmt(sc.hi);
    $("legend-note").textContent = sc.note;
    $("legend-masked").hidden = !mask || !mask.some((v) => v);
    $("legend-cache").hidden = !(r.step > 0 && r.axes[1] === "m");
  }

  // The heading (name, shape, pass, intervention) and the reading notes of the view on show.
  function describe(r, sc) {
    const c = state.info.model;
    const headTxt = r.head_axis ? ` · ${r.head_axis === "H" ? "query" : "key/value"} head ${r.head}` : "";
    const what = r.grad ? `∂ loss / ∂ ${r.name}` : r.name;
    $("view-name").textContent = what + headTxt;
    const iv = state.intervention && !r.step ? ` · with intervention: ${Interventions.text(state.intervention)}` : "";
    // n counts the pass's positions; they are queries, and m keys, only in a view with a key axis (m).
    const keys = r.axes.includes("m");
    const stepTxt = r.step
      ? `decoding step ${r.step}: n = ${r.n} new ${keys ? "query" : "position"}` +
        (keys ? `, m = ${r.m} keys (${r.start} cached + ${r.n} new)` : `, after ${r.start} cached`)
      : `prompt pass: n = ${keys ? plural(r.n, "query", "queries") : plural(r.n, "position")}` +
        (keys ? `, m = ${plural(r.m, "key")}` : "");
    const shape = `shape (${r.axes.filter((a) => a).map((a, i) => `${a} = ${r.shape[i]}`).join(", ")})`;
    const target = r.grad ? ` · loss = −log p(${JSON.stringify(r.target_piece)}) at the last position` : "";
    $("view-shape").textContent = `${shape} · ${stepTxt}${target}${iv}`;
    const scale = el("p", {id: "howto-scale"}, "Colour: ");
    scale.append(el("b", {}, sc.note), ".");
    $("howto-text").replaceChildren(...Explain.howTo(r, c, sc).map((t) => el("p", {}, t)), scale);
    Explain.draw(r);
  }

  function build() {
    // Redraw when the heatmap's frame changes width (the layout depends on it), not on every height change:
    // the window's width, or a notebook's output frame that gets its width only after the first draw.
    new ResizeObserver(() => {
      const w = $("heatmap-wrap").clientWidth;
      if (state.snapshot && w > 0 && state.tab === "heatmap" && (!glass.heatmap || w !== glass.heatmap.wrapWidth)) draw();
    }).observe($("heatmap-wrap"));
    $("explain-map").addEventListener("click", () => Tabs.show("map"));
  }

  return {body, load, draw, build};
})();
