// lens.js: the prompt's whole-pass views under the heatmap: the logit lens (each residual stream read through
// the final norm and the output matrix) and the direct logit attribution (what each head and MLP writes into
// the predicted token's logit). Both describe the prompt's own pass (no intervention, no decoding step):
// glassllm.trace.lens_top and glassllm.trace.direct_attribution answer them. glass.lens and
// glass.attribution hold what is shown.
"use strict";

const Lens = (() => {
  const LENS_COLUMNS = 12;

  // One of the prompt's whole-pass views: asked for, kept in glass[kind], drawn into #box by `draw`;
  // if it cannot be had, the box is emptied and #errorLine says why.
  function loadPanel(kind, box, errorLine, draw) {
    return Api.load(kind, kind, {prompt: state.prompt}, {
      error: errorLine,
      draw: (r) => { glass[kind] = r; draw(r, $(box)); },
      fail: () => { glass[kind] = null; $(box).replaceChildren(); },
    });
  }

  function load() {
    return loadPanel("lens", "lens", "lens-error", (r, table) => {
      // The last LENS_COLUMNS positions only: a table cell per stream and position (the page stays small).
      const first = Math.max(0, r.pieces.length - LENS_COLUMNS);
      $("lens-note").textContent = first > 0 ? `positions ${first}–${r.pieces.length - 1} of ${r.pieces.length}` : "";
      const head = el("tr");
      head.append(el("th", {}, "stream ↓ · position →"));
      r.pieces.slice(first).forEach((p, j) => head.append(
        el("th", {title: `position ${first + j}`}, `${first + j} ${clip(show(p), 10)}`)));
      const rows = r.streams.map((name, s) => {
        const tr = el("tr");
        tr.append(el("th", {}, name));
        r.top_pieces[s].slice(first).forEach((piece, j) => {
          const i = first + j;
          const p = r.prob[s][i];
          const td = el("td", {title: `${name}, position ${i}: ${JSON.stringify(piece)} (id ${r.top[s][i]}), p = ${p}`});
          td.style.background = `rgba(44, 111, 187, ${(0.6 * p).toFixed(3)})`;
          td.append(document.createTextNode(clip(show(piece), 10)), el("small", {}, p.toFixed(2)));
          tr.append(td);
        });
        return tr;
      });
      table.replaceChildren(head, ...rows);
    });
  }

  function loadAttribution() {
    return loadPanel("attribution", "attr-bars", "attr-error", (r, list) => {
      $("attr-line").textContent = `Logit of ${JSON.stringify(r.piece)} (id ${r.token}) at position ${r.position}: `
        + `${fmt(r.total)}, split into what each part writes directly (the final norm's scale frozen).`;
      const top = Math.max(...r.values.map(Math.abs), 1e-12);
      list.replaceChildren(...r.labels.map((label, i) => {
        const v = r.values[i], w = (50 * Math.abs(v) / top).toFixed(2);
        const bar = el("span", {class: "bar " + (v >= 0 ? "pos" : "neg")});
        bar.style.width = w + "%";
        bar.style.left = v >= 0 ? "50%" : (50 - Number(w)) + "%";
        const track = el("span", {class: "track"});
        track.append(bar);
        const li = el("li", {"data-label": label});
        li.append(el("span", {class: "mono small"}, label), track, el("span", {class: "mono small"}, fmt(v, 3)));
        return li;
      }));
    });
  }

  return {load, loadAttribution};
})();
