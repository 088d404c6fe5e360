// grid.js: the All heads tab: every layer's and head's attention pattern (or its gradient) as thumbnails on
// one colour scale; a click opens a head in the heatmap. glass.grid holds what is shown.
"use strict";

const Grid = (() => {
  // The head-grid request of the current choice (always the prompt's pass: the grid has no decoding step).
  function body() {
    const out = {prompt: state.prompt};
    if (state.grad) out.grad = true;
    if (state.grad && state.target !== null) out.target = state.target;
    if (state.intervention) out.intervention = state.intervention;
    return out;
  }

  // One colour scale for every thumbnail: weights on the fixed 0 … 1, gradients symmetric around 0.
  function gridScale(r) {
    if (!r.grad) return {kind: "seq", lo: 0, hi: 1, note: "fixed scale 0 … 1: white is 0, darkest blue is 1"};
    let a = 0;
    for (const v of r.data) if (Number.isFinite(v)) a = Math.max(a, Math.abs(v));
    a = a || 1;
    return {kind: "div", lo: -a, hi: a, note: "symmetric scale −a … a, a = the largest |value| of any head: white is 0, " +
      "blue below, red above"};
  }

  async function load() {
    if (!state.prompt || state.tab !== "heads") return;
    await Api.load("grid", "heads", body(), {
      error: "grid-error",
      draw: (r) => {
        r.data = r.data || Api.decode(r.values);
        r.mask = r.mask || Api.decode(r.masked);
        draw(r);
      },
      // Nothing shown: no title, scale or reading notes of the previous view either.
      fail: () => {
        $("head-grid").replaceChildren(); glass.grid = null;
        for (const id of ["grid-title", "grid-legend-lo", "grid-legend-hi", "grid-legend-note"]) $(id).textContent = "";
        $("grid-howto").replaceChildren(el("p", {}, "No heads to read: see the message above."));
      },
    });
  }

  function draw(r) {
    const [L, H, k] = r.values.shape;
    const sc = gridScale(r);
    const box = $("head-grid");
    const size = Math.max(48, Math.min(150, Math.floor((box.clientWidth - 70) / H) - 8));
    box.style.gridTemplateColumns = `auto repeat(${H}, ${size + 6}px)`;
    const parts = [el("span")];
    for (let h = 0; h < H; h++) parts.push(el("span", {class: "label"}, `head ${h}`));
    for (let l = 0; l < L; l++) {
      parts.push(el("span", {class: "label"}, `layer ${l}`));
      const mask = r.mask.subarray(l * k * k, (l + 1) * k * k);
      for (let h = 0; h < H; h++) {
        const b = el("button", {type: "button", class: "thumb", "data-layer": String(l), "data-head": String(h)});
        b.setAttribute("aria-label", `layer ${l}, head ${h}: open its ${r.grad ? "gradient" : "weights"}`);
        const cv = el("canvas");
        Paint.paint(cv, r.data.subarray((l * H + h) * k * k, (l * H + h + 1) * k * k), k, k, mask, sc, size, size);
        b.append(cv);
        b.addEventListener("click", () => ModelMap.openView({name: "attn.softmax", layer: l, head: h}));
        const tip = (ev) => {
          const t = $("tooltip");
          t.replaceChildren(el("div", {class: "big"}, `layer ${l}, head ${h}`),
                            el("div", {class: "small muted"}, "click to open this head"));
          t.dataset.layer = String(l); t.dataset.head = String(h);
          const at = b.getBoundingClientRect();
          t.style.left = at.right + window.scrollX + 6 + "px"; t.style.top = at.top + window.scrollY + "px";
          t.hidden = false;
        };
        b.addEventListener("mouseenter", tip);
        b.addEventListener("focus", tip);
        b.addEventListener("mouseleave", Cells.hide);
        b.addEventListener("blur", Cells.hide);
        parts.push(b);
      }
    }
    box.replaceChildren(...parts);
    Paint.scaleBar($("grid-legend-bar"), sc);
    $("grid-legend-lo").textContent = fmt(sc.lo);
    $("grid-legend-hi").textContent = fmt(sc.hi);
    $("grid-legend-note").textContent = sc.note;
    const what = r.grad ? `∂ loss / ∂ attn.softmax, loss = −log p(${JSON.stringify(r.target_piece)}) at the last position`
      : "attn.softmax, the attention weights";
    $("grid-title").textContent = `Every layer and head of the prompt's pass: ${what}` +
      (state.intervention ? `, with intervention: ${Interventions.text(state.intervention)}` : "") +
      (state.step ? " (the grid shows the prompt's pass, not the decoding step)" : "") + ".";
    const howto = [
      "Each thumbnail is one head's pattern: rows are queries, columns keys, as in the heatmap. Hatched cells are " +
      "future keys (masked). Hover for the layer and head; click to open it in the heatmap.",
      "Patterns to look for: a diagonal just below the main one is a previous-token head; a stripe a fixed distance " +
      "back in a repeated text is an induction head (each token reads the token after its earlier copy).",
    ];
    if (r.block > 1) howto.push(`This prompt has ${r.n} tokens: each thumbnail cell is the mean of a ${r.block} × ` +
      `${r.block} block of cells (masked cells left out); the heatmap shows every cell.`);
    if (r.grad) howto.push("These are gradients: red raises the loss, blue lowers it.");
    const scale = el("p", {id: "grid-howto-scale"}, "Colour: ");
    scale.append(el("b", {}, sc.note), ".");
    $("grid-howto").replaceChildren(...howto.map((t) => el("p", {}, t)), scale);
    glass.grid = {layers: L, heads: H, size: k, block: r.block, grad: r.grad, values: r.data, masked: r.mask, scale: sc};
  }

  return {load};
})();
