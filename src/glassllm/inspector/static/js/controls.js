// controls.js: the header's lines and the choice of view: the Layer, Snapshot, Head and value/gradient
// controls, kept in step with `state`, and the head each new selection lands on.
"use strict";

const Controls = (() => {
  // The head of a new selection. Query heads (H) and key/value heads (G) are remembered
  // apart; moving from query head h to a key/value snapshot picks the K/V head that h reads
  // (h / n_rep, grouped-query attention), and moving back restores the query head.
  const heads = {H: 0, G: 0};
  let lastAxis = "H";                // the head axis of the last snapshot that had one

  function normalizeSelection(sel) {
    const out = {...sel};
    // Views without a gradient (the boolean mask; probs, which the loss does not read) show their values.
    const to = out.name ?? state.name;
    if ((out.grad ?? state.grad) && (to === "probs" || to.endsWith("attn.mask"))) out.grad = false;
    const before = state.names[state.name];
    if (before && before.heads) heads[before.head_axis] = state.head;   // remember the head being left
    const meta = state.names[out.name ?? state.name];
    if (!meta || !meta.heads) return out;
    const axis = meta.head_axis;
    if (out.head !== undefined && out.head !== null) heads[axis] = out.head;
    else if (axis === "G" && lastAxis === "H") heads.G = Math.floor(heads.H / state.info.model.n_heads * state.info.model.n_kv_heads);
    lastAxis = axis;
    out.head = Math.min(heads[axis], meta.heads - 1);
    return out;
  }

  // The head a view on head axis ``axis`` ("H" or "G") lands on, as a new selection would: the one last
  // chosen on that axis, or, for key/value heads while query heads are chosen, the K/V head the query head reads.
  const rememberedHead = (axis) => axis === "G" && lastAxis === "H"
    ? Math.floor(heads.H / state.info.model.n_heads * state.info.model.n_kv_heads) : heads[axis];

  // The header's second line: where the numbers come from, and which path (kernel or reference) the layers took.
  function drawModeLine(paths) {
    const line = $("mode-line");                        // one line: the full text is its tooltip
    line.textContent = (state.mode === "export" ? "offline export: one prompt, precomputed"
      : Api.source.kernel ? "live: this notebook's kernel" : "live: local server") + (paths ? ` · ${paths}` : "");
    line.title = line.textContent;
  }

  function build() {
    const info = state.info, c = info.model, given = info.source;   // given: attention weights passed in as arrays, no model
    $("model-line").textContent = given ? `attention weights given as arrays: ${plural(given.layers, "layer")} · ` +
      `${plural(given.heads, "head")} · ${plural(given.tokens, "token")}` :
      `${plural(c.n_layers, "layer")} · width C = ${c.dim} · ${plural(c.n_heads, "query head")} sharing ` +
      `${plural(c.n_kv_heads, "key/value head")} ` +
      `of size D = ${c.head_dim} · MLP F = ${c.ffn_dim} · vocabulary V = ${nice(c.vocab_size)} · ` +
      `context ${c.max_seq_len} · ${nice(c.params)} parameters (${c.dtype})` +
      (info.meta.step ? ` · trained ${info.meta.steps_before ? nice(Number(info.meta.steps_before)) + " + " : ""}` +
                        `${nice(Number(info.meta.step))} steps` : "") +
      (info.meta.valid_loss ? `, held-out loss ${Number(info.meta.valid_loss).toFixed(3)} nats/token` : "");
    drawModeLine(null);
    document.querySelectorAll(".vocab-n").forEach((e) => (e.textContent = nice(c.vocab_size)));

    const layers = $("layers");
    layers.replaceChildren();
    for (let l = 0; l < c.n_layers; l++) {
      const b = el("button", {type: "button", "data-layer": String(l), role: "radio"}, String(l));
      b.addEventListener("click", () => userSelect({layer: l}));
      layers.append(b);
    }
    // A notebook view holds only some snapshots (info.offline): it lists those and says how to include more.
    const select = $("snapshot");
    select.replaceChildren();
    const groups = new Map();
    for (const n of info.names) {
      if (!n.held) continue;
      if (!groups.has(n.group)) groups.set(n.group, el("optgroup", {label: n.group}));
      const shape = n.axes.join(", ");
      groups.get(n.group).append(el("option", {value: n.name}, `${n.name}  (${shape})`));
    }
    for (const g of groups.values()) select.append(g);
    select.addEventListener("change", () => userSelect({name: select.value}));
    $("showwhat").querySelectorAll("button").forEach((b) =>
      b.addEventListener("click", () => userSelect({grad: b.dataset.grad === "1"})));
    // Arrow keys move within a group of radio buttons (layer, head, value/gradient), as in any radio group.
    for (const id of ["layers", "heads", "showwhat"]) {
      $(id).addEventListener("keydown", (e) => {
        const step = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1}[e.key];
        if (!step) return;
        const buttons = [...$(id).querySelectorAll("button:not([disabled])")];
        const at = buttons.indexOf(document.activeElement);
        if (at < 0 || buttons.length < 2) return;
        e.preventDefault();
        const next = buttons[(at + step + buttons.length) % buttons.length];
        next.focus();
        next.click();
      });
    }
    const off = info.offline;
    if (off) {
      const missing = info.names.length - off.held.length;
      $("offline-note").hidden = !missing;
      $("offline-note").textContent = missing
        ? `This notebook view holds ${off.held.length} of the ${info.names.length} snapshots; ${off.more_names}.` : "";
    }
  }

  function sync() {
    const c = state.info.model;
    const meta = state.names[state.name];
    $("layers").querySelectorAll("button").forEach((b) => {
      b.classList.toggle("on", Number(b.dataset.layer) === state.layer);
      b.setAttribute("aria-checked", String(Number(b.dataset.layer) === state.layer));
      b.disabled = !meta.in_layer;
    });
    $("snapshot").value = state.name;
    const buttons = $("heads");
    const hadFocus = buttons.contains(document.activeElement);            // rebuilding must not drop the focus
    buttons.replaceChildren();
    if (meta.heads) {
      for (let h = 0; h < meta.heads; h++) {
        const b = el("button", {type: "button", "data-head": String(h), role: "radio"}, String(h));
        b.classList.toggle("on", h === state.head);
        b.setAttribute("aria-checked", String(h === state.head));
        b.addEventListener("click", () => userSelect({head: h}));
        buttons.append(b);
      }
      if (hadFocus) buttons.querySelector(`button[data-head="${state.head}"]`).focus();
      const rep = c.n_heads / c.n_kv_heads;
      const kind = meta.head_axis === "H"
        ? `${c.n_heads} query heads · head ${state.head} reads key/value head ${Math.floor(state.head / rep)}`
        : `${c.n_kv_heads} key/value heads · head ${state.head} serves query heads ${state.head * rep}–${state.head * rep + rep - 1}`;
      buttons.append(el("span", {class: "muted small"}, kind));
    } else {
      buttons.append(el("span", {class: "muted small"}, "this snapshot has no head axis"));
    }
    $("showwhat").querySelectorAll("button").forEach((b) => {
      b.classList.toggle("on", (b.dataset.grad === "1") === state.grad);
      b.setAttribute("aria-checked", String((b.dataset.grad === "1") === state.grad));
      // No gradient to show: a decoding step (no loss there), the boolean mask, and probs (the loss is
      // computed from the logits, so its gradient with respect to probs is exactly 0 everywhere).
      const why = b.dataset.grad !== "1" ? "" : state.step > 0 ? "gradients are for the prompt's pass"
        : state.name.endsWith("attn.mask") ? "the mask is boolean: it has no gradient"
        : state.name === "probs" ? "the loss is computed from the logits, so ∂loss/∂probs is 0: view the logits' gradient"
        : "";
      b.disabled = !!why;
      b.title = why;
    });
    for (const id of ["layers", "heads", "showwhat"]) rove($(id));
    if (state.tab === "map") ModelMap.update();
  }

  // One Tab stop per group of radio buttons: the chosen one (or the first that can be chosen); the arrow
  // keys move within the group. So Tab goes layer -> head -> value/gradient -> heatmap, not button by button.
  function rove(group) {
    const buttons = [...group.querySelectorAll("button")];
    const stop = buttons.find((b) => b.classList.contains("on") && !b.disabled) || buttons.find((b) => !b.disabled);
    for (const b of buttons) b.tabIndex = b === stop ? 0 : -1;
  }

  // A selection made on the page (its controls, the model map, the head grid): the view loads, and how long
  // that took goes to glass.timings. An open step-through follows the Head buttons too.
  function userSelect(sel) {
    const t0 = performance.now();
    Object.assign(state, normalizeSelection(sel));
    sync();
    if (state.tab === "walk") Walk.redraw();
    return Heatmap.load().then(() => glass.timings.push({what: Object.keys(sel).join(","), ms: performance.now() - t0}));
  }

  return {build, sync, select: userSelect, normalizeSelection, rememberedHead, drawModeLine};
})();
