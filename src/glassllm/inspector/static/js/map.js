// map.js: the Model map tab: the forward pass of one block, drawn from info.names (the tracer's registry, in
// forward order): one row per module (the name's first part), the names inside the blocks framed as one
// block, each a button with its shape for this prompt. A name the registry gains appears by itself.
"use strict";

const ModelMap = (() => {
  const nodes = new Map();           // local name -> its button

  function build() {
    const box = $("model-map");
    box.replaceChildren();
    nodes.clear();
    const start = el("div", {class: "map-row"});
    start.append(el("span", {class: "map-module label"}, "input"), el("span", {class: "map-node fixed", id: "map-tokens"}, "tokens"));
    box.append(start);
    let block = null, row = null, module = null;
    for (const n of state.info.names) {
      if (n.in_layer && !block) {
        block = el("div", {class: "map-block"});
        block.append(el("div", {class: "map-block-title small", id: "map-block-title"}));
        box.append(block);
      }
      const parent = n.in_layer ? block : box;
      const mod = n.name.split(".")[0];
      if (mod !== module || row.parentElement !== parent) {
        row = el("div", {class: "map-row", "data-module": mod});
        row.append(el("span", {class: "map-module label"}, mod));
        parent.append(row);
        module = mod;
      } else row.append(el("span", {class: "map-arrow", "aria-hidden": "true"}, "→"));
      const b = el("button", {type: "button", class: "map-node", "data-name": n.name});
      b.append(el("b", {}, n.name.startsWith(mod + ".") ? n.name.slice(mod.length + 1) : n.name),
               el("small", {class: "mono"}, n.axes.join(", ")));
      b.title = n.name;
      if (!n.held) { b.disabled = true; b.dataset.absent = "1"; }
      b.addEventListener("click", () => openView({name: n.name}));
      row.append(b);
      nodes.set(n.name, b);
    }
  }

  // Open a view in the heatmap tab (from the map or the grid).
  function openView(sel) {
    Tabs.show("heatmap");
    return Controls.select(sel);
  }

  // Shapes for the current prompt and step, the block's layer, and the node on show.
  function update() {
    if (!nodes.size) return;
    const c = state.info.model, L = c.n_layers;
    const n = state.step ? 1 : state.ids.length, m = state.ids.length + state.step;
    const sizes = {n, m, H: c.n_heads, G: c.n_kv_heads, D: c.head_dim, C: c.dim, F: c.ffn_dim, V: c.vocab_size};
    $("map-tokens").textContent = `tokens (${n} ${state.step ? `new, ${m - 1} cached` : "ids"})`;
    $("map-block-title").textContent = `block ${state.layer} of ${L} (layers 0 … ${L - 1} repeat it; ` +
      "the Layer buttons above choose one)";
    for (const [name, b] of nodes) {
      const meta = state.names[name];
      const shape = meta.axes.map((a) => sizes[a]);
      b.querySelector("small").textContent = `(${shape.join(", ")}${shape.length === 1 ? "," : ""})`;
      b.title = `${meta.in_layer ? `layers.${state.layer}.` : ""}${name}: axes (${meta.axes.join(", ")})` +
        (meta.explain ? ` · ${meta.explain.equation.text} · ${meta.explain.path}:${meta.explain.line}` : "");
      b.dataset.full = meta.in_layer ? `layers.${state.layer}.${name}` : name;
      b.dataset.shape = shape.join(",");
      const on = name === state.name;
      b.classList.toggle("on", on);
      if (on) b.setAttribute("aria-current", "true"); else b.removeAttribute("aria-current");
    }
  }

  // The step-through's snapshot ``local`` (of block ``layer``; null outside the blocks), marked on the map.
  function markStep(local, layer) {
    for (const [name, b] of nodes) {
      b.classList.toggle("walk-on", name === local);
      if (name === local) b.setAttribute("aria-current", "step"); else if (b.getAttribute("aria-current") === "step") b.removeAttribute("aria-current");
    }
    if ($("map-block-title") && layer !== null) $("map-block-title").textContent = `block ${layer} of ${state.info.model.n_layers}`;
  }

  return {build, update, openView, markStep};
})();
