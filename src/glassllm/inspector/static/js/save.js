// save.js: each view's "save" buttons: a PNG of what is drawn (the canvas; lists and tables drawn as a table),
// and CSV and JSON of its numbers. Every file names the prompt, the model and the view (snapshot, layer, head).
"use strict";

const Save = (() => {
  function modelText() { return $("model-line").textContent; }

  // The numbers of a view as {title, fields (for the JSON), columns, rows: [[label, ...values]], picture?}, or null.
  function viewTable(kind) {
    if (kind === "heatmap") {
      const h = glass.heatmap;
      if (!h) return null;
      const colLabel = (j) => h.colLabels ? `${j} ${h.colLabels[j]}` : String(j);
      const rowLabel = (i) => h.rowLabels && h.rowLabels.length ? `${state.snapshot.row_pos[i]} ${h.rowLabels[i]}` : String(i);
      const rows = [];
      for (let i = 0; i < h.rows; i++) {
        const row = [rowLabel(i)];
        for (let j = 0; j < h.cols; j++) row.push(h.masked && h.masked[i * h.cols + j] ? "" : h.values[i * h.cols + j]);
        rows.push(row);
      }
      return {title: (h.grad ? "grad-" : "") + h.name + (h.head === null || h.head === undefined ? "" : `-head${h.head}`),
              fields: {snapshot: h.name, layer: h.layer, head: h.head, gradient: !!h.grad, step: h.step, axes: h.axes,
                       shape: [h.rows, h.cols], masked: h.masked ? Array.from(h.masked, Boolean) : null},
              columns: [`${h.axes[0]} \\ ${h.axes[1]}`, ...Array.from({length: h.cols}, (_, j) => colLabel(j))], rows};
    }
    if (kind === "next") {
      const x = glass.next;
      if (!x) return null;
      const top = Sampling.ranked(x.probs, 12, x.logits);
      return {title: "next-token", fields: {snapshot: "probs", temperature: x.temperature, top_k: x.topK, top_p: x.topP,
                                            step: x.step},
              columns: ["id", "piece", "logit", "p", "sampled"],
              rows: top.map((id) => [id, state.info.vocab[id], x.logits[id], x.probs[id], x.sampled[id]])};
    }
    if (kind === "lens") {
      const r = glass.lens;
      if (!r) return null;
      const [first, stop] = r.positions, pieces = r.pieces.slice(first, stop);
      return {title: "logit-lens", fields: {snapshot: "logit lens (resid streams through the final norm and output)",
                                            positions: r.positions, length: r.length},
              columns: ["stream", ...pieces.map((p, i) => `${first + i} ${p}`)],
              rows: r.streams.map((name, s) => [name, ...r.top_pieces[s].map((p, i) => `${p} (${r.prob[s][i]})`)]),
              // the PNG shows the table as the page does: spaces as ␣, probabilities to 2 decimals
              picture: {columns: ["stream", ...pieces.map((p, i) => `${first + i} ${show(p)}`)],
                        rows: r.streams.map((name, s) => [name, ...r.top_pieces[s].map((p, i) =>
                          `${show(p)} ${r.prob[s][i].toFixed(2)}`)])}};
    }
    if (kind === "attribution") {
      const r = glass.attribution;
      if (!r) return null;
      return {title: "attribution", fields: {snapshot: "direct logit attribution", token: r.token, piece: r.piece,
                                             position: r.position, total: r.total},
              columns: ["part", "logit"], rows: r.labels.map((label, i) => [label, r.values[i]])};
    }
    if (kind === "grid") {
      const g = glass.grid;
      if (!g) return null;
      const rows = [], k = g.size;
      for (let l = 0; l < g.layers; l++) for (let h = 0; h < g.heads; h++) for (let i = 0; i < k; i++) {
        const row = [`layer ${l} head ${h} query ${i}`];
        for (let j = 0; j < k; j++) row.push(g.values[((l * g.heads + h) * k + i) * k + j]);
        rows.push(row);
      }
      return {title: "all-heads" + (g.grad ? "-grad" : ""), fields: {snapshot: "attn.softmax", gradient: !!g.grad,
                                                                      shape: [g.layers, g.heads, k, k]},
              columns: ["layer, head, query \\ key", ...Array.from({length: k}, (_, j) => String(j))], rows};
    }
    return null;
  }

  function csvCell(v) {
    const s = typeof v === "number" ? String(v) : String(v ?? "");
    return /[",\n\r#]/.test(s) || /^\s|\s$/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  }

  function saveFile(name, blob) {
    const a = el("a", {href: URL.createObjectURL(blob), download: name});
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  }

  // A list or table view drawn as a table on a canvas, for its PNG (t.picture: the cells as the page shows
  // them, where they differ from the saved numbers). cv.lines: the text drawn, one tab-separated line a row.
  function tableCanvas(t) {
    const {columns, rows} = t.picture || t;
    const shown = rows.slice(0, 80);
    const widths = columns.map((c, j) => Math.min(160, Math.max(String(c).length, ...shown.map((r) =>
      String(typeof r[j] === "number" ? fmt(r[j]) : r[j]).length)) * 7 + 12));
    const W = widths.reduce((a, b) => a + b, 0), H = 22 * (shown.length + 2) + 8;
    const cv = el("canvas");
    cv.width = W; cv.height = H;
    const g = cv.getContext("2d");
    g.fillStyle = "#fffdf8"; g.fillRect(0, 0, W, H);
    g.font = "12px ui-monospace, monospace"; g.fillStyle = "#2b2a27"; g.textBaseline = "middle";
    g.fillText(`${t.title} · ${state.prompt.slice(0, 80)}`, 6, 12);
    cv.lines = [columns, ...shown].map((row, i) => {
      let x = 6;
      return row.map((v, j) => {
        const s = clip(String(typeof v === "number" ? fmt(v) : v), Math.floor(widths[j] / 7) - 1);
        g.fillText(s, x, 34 + 22 * i);
        x += widths[j];
        return s;
      }).join("\t");
    });
    return cv;
  }

  function save(kind, format) {
    const t = viewTable(kind);
    if (!t) return null;
    const base = `glassllm-${t.title}`.replace(/[^\w.+-]+/g, "_");
    const about = {prompt: state.prompt, model: modelText(), view: kind, ...t.fields};
    let text = null;
    if (format === "csv") {
      text = Object.entries(about).filter(([k]) => k !== "masked")
        .map(([k, v]) => `# ${k}: ${typeof v === "string" ? v.replace(/[\r\n]+/g, " ") : JSON.stringify(v)}`).join("\n") + "\n" +
        [t.columns, ...t.rows].map((r) => r.map(csvCell).join(",")).join("\n") + "\n";
      saveFile(base + ".csv", new Blob([text], {type: "text/csv"}));
    } else if (format === "json") {
      text = JSON.stringify({...about, columns: t.columns, rows: t.rows});
      saveFile(base + ".json", new Blob([text], {type: "application/json"}));
    } else {
      const canvas = kind === "heatmap" ? $("heatmap") : kind === "grid" ? gridCanvas() : tableCanvas(t);
      canvas.toBlob((b) => saveFile(base + ".png", b), "image/png");
      if (canvas.lines) text = canvas.lines.join("\n");      // a table's PNG: the text it shows
    }
    glass.saved = {kind, format, name: base + "." + format, text};
    return glass.saved;
  }

  // The head grid's thumbnails side by side on one canvas, as the grid shows them.
  function gridCanvas() {
    const thumbs = [...$("head-grid").querySelectorAll("canvas")];
    const H = glass.grid.heads, size = thumbs.length ? thumbs[0].width : 1;
    const cv = el("canvas");
    cv.width = H * (size + 4); cv.height = Math.ceil(thumbs.length / H) * (size + 4);
    const g = cv.getContext("2d");
    g.fillStyle = "#fffdf8"; g.fillRect(0, 0, cv.width, cv.height);
    thumbs.forEach((t, i) => g.drawImage(t, (i % H) * (size + 4), Math.floor(i / H) * (size + 4)));
    return cv;
  }

  function build() {
    document.querySelectorAll(".save").forEach((box) => box.querySelectorAll("button").forEach((b) => {
      b.title = `save this view as ${b.dataset.format.toUpperCase()} (with the prompt, the model and the view's name)`;
      b.addEventListener("click", () => save(box.dataset.view, b.dataset.format));
    }));
  }

  return {build, save};
})();
