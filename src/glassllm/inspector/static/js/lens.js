// lens.js: the prompt's whole-pass views under the heatmap: the logit lens (each residual stream read through
// the final norm and the output matrix) and the direct logit attribution (what each head and MLP writes into
// the predicted token's logit). Both describe the prompt's own pass (no intervention, no decoding step):
// glassllm.trace.lens_top and glassllm.trace.direct_attribution answer them. glass.lens and
// glass.attribution hold what is shown.
"use strict";

const Lens = (() => {
  // One of the prompt's whole-pass views: asked for, kept in glass[kind], drawn into #box by `draw`;
  // if it cannot be had, the box is emptied and #errorLine says why.
  function loadPanel(kind, box, errorLine, draw, extra = {}) {
    return Api.load(kind, kind, {prompt: state.prompt, ...extra}, {
      error: errorLine,
      draw: (r) => { glass[kind] = r; draw(r, $(box)); },
      fail: () => { glass[kind] = null; $(box).replaceChildren(); },
    });
  }

  // The answer holds one window of positions, [start, stop) of `length` (the server computes only those
  // columns; by default the last 16): a table cell per stream and position. The earlier/later buttons ask
  // for the windows the answer names (`earlier`, `later`), each computed once and then kept.
  function load(positions) {
    const nav = (id, to) => {
      const b = $(id);
      b.disabled = !to;
      b.onclick = to ? () => load(to) : null;
    };
    return loadPanel("lens", "lens", "lens-error", (r, table) => {
      const [first, stop] = r.positions;
      const whole = first === 0 && stop === r.length;
      $("lens-note").textContent = whole ? "" : `positions ${first}–${stop - 1} of ${r.length}`;
      $("lens-nav").hidden = whole;
      nav("lens-earlier", r.earlier);
      nav("lens-later", r.later);
      const head = el("tr");
      head.append(el("th", {}, "stream ↓ · position →"));
      r.pieces.slice(first, stop).forEach((p, j) => head.append(
        el("th", {title: `position ${first + j}`}, `${first + j} ${clip(show(p), 10)}`)));
      const rows = r.streams.map((name, s) => {
        const tr = el("tr");
        tr.append(el("th", {}, name));
        r.top_pieces[s].forEach((piece, j) => {
          const i = first + j;
          const p = r.prob[s][j];
          const td = el("td", {title: `${name}, position ${i}: ${JSON.stringify(piece)} (id ${r.top[s][j]}), p = ${p}`});
          td.style.background = `rgba(44, 111, 187, ${(0.6 * p).toFixed(3)})`;
          td.append(document.createTextNode(clip(show(piece), 10)), el("small", {}, p.toFixed(2)));
          tr.append(td);
        });
        return tr;
      });
      table.replaceChildren(head, ...rows);
      // Wider than its card, the table scrolls: start at its right end, the last position (the Next-token card's).
      table.parentElement.scrollLeft = table.parentElement.scrollWidth;
    }, positions ? {positions} : {});
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
