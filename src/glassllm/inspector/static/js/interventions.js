// interventions.js: the Intervene card: ablate a head, switch off the causal mask, divide the scores by T,
// or set one number (a cell picked in the heatmap), and the next-token distribution before and after.
"use strict";

const Interventions = (() => {
  const pickHint = $("iv-cell").textContent;   // the page's own words for "no cell picked yet"
  const OFFLINE_EDIT = "setting a number needs a new forward pass: run glassllm inspect";

  function text(iv) {
    if (iv.kind === "ablate") return `head ${iv.head} of layer ${iv.layer} ablated (its mix zeroed)`;
    if (iv.kind === "mask_off") return `causal mask switched off in layer ${iv.layer}`;
    if (iv.kind === "edit") return `${cellText(iv)} set to ${iv.value}`;
    return `scores of layer ${iv.layer} divided by T = ${iv.temperature}`;
  }

  function cellText(c) {
    const head = c.head !== null && c.head !== undefined ? `, head ${c.head}` : "";
    return `layers.${c.layer}.${c.name}${head}, cell (${c.row}, ${c.col})`;
  }

  // What an intervention changes and what it leaves, in words.
  function note(iv) {
    if (!iv) return "";
    if (iv.kind === "ablate") return `Ablating head ${iv.head} of layer ${iv.layer} sets its output to zero: its rows of ` +
      "attn.mix (the weighted sum of values) become 0 before W_O mixes the heads. Everything computed before that " +
      "stays as it was: this head's queries, keys, scores and weights (so its own pattern does not change), the other " +
      `heads of layer ${iv.layer}, and every earlier layer. What changes is attn.mix and attn.out of layer ${iv.layer}, ` +
      "the residual stream from there on, every later layer, and the logits.";
    if (iv.kind === "mask_off") return `Switching off the mask of layer ${iv.layer} lets its queries read future keys: ` +
      "its scores are unchanged (the mask is applied after them); its weights and everything after them change.";
    if (iv.kind === "temperature") return `Dividing the scores of layer ${iv.layer} by T = ${iv.temperature} changes ` +
      "that layer's weights and everything after them; everything before them, and every earlier layer, stays as it was.";
    return "Setting one number changes everything computed from it; everything computed before it stays as it was.";
  }

  // The intervention the card's controls describe (null: none), showing the controls that kind needs.
  function read() {
    const kind = document.querySelector("input[name=iv]:checked").value;
    const editing = state.editing;
    $("iv-head-wrap").hidden = kind !== "ablate";
    $("iv-temp-wrap").hidden = kind !== "temperature";
    $("iv-edit-wrap").hidden = kind !== "edit";
    $("iv-layer-row").hidden = kind === "edit";               // an edited cell brings its own layer
    if (kind === "none") return null;
    if (kind === "edit") {
      const value = Number($("iv-value").value);
      if (!editing) return null;
      $("iv-cell").textContent = `${cellText(editing)}: was ${editing.was}`;
      const ok = $("iv-value").value.trim() !== "" && Number.isFinite(value) && Math.abs(value) <= 1e6;
      if (!ok) {
        // Keep the last value this cell was given, and say so, rather than silently dropping the edit.
        const prev = state.intervention;
        const kept = prev && prev.kind === "edit" && prev.name === editing.name && prev.layer === editing.layer &&
          (prev.head ?? null) === editing.head && prev.row === editing.row && prev.col === editing.col ? prev : null;
        $("iv-value-note").textContent = "type a number between −1,000,000 and 1,000,000" +
          (kept ? `; still applied: ${kept.value}` : "");
        return kept;
      }
      $("iv-value-note").textContent = "";
      const iv = {kind, layer: editing.layer, name: editing.name, row: editing.row, col: editing.col, value};
      if (editing.head !== null) iv.head = editing.head;
      return iv;
    }
    const iv = {kind, layer: Number($("iv-layer").value)};
    if (kind === "ablate") iv.head = Number($("iv-head").value);
    if (kind === "temperature") iv.temperature = Number($("iv-temp").value);
    return iv;
  }

  // Set the card's controls to ``iv`` (glass.intervene).
  function set(iv) {
    const kind = iv ? iv.kind : "none";
    document.querySelector(`input[name=iv][value=${kind}]`).checked = true;
    if (iv && iv.kind === "edit") {
      const editing = state.editing;
      const same = editing && editing.name === iv.name && editing.layer === iv.layer &&
        editing.head === (iv.head ?? null) && editing.row === iv.row && editing.col === iv.col;
      state.editing = {name: iv.name, layer: iv.layer, head: iv.head ?? null, row: iv.row, col: iv.col,
                       was: same ? editing.was : "?"};
      $("iv-value").value = String(iv.value);
    } else if (iv) {
      $("iv-layer").value = String(iv.layer);
      if (iv.head !== undefined && iv.head !== null) $("iv-head").value = String(iv.head);
      if (iv.temperature !== undefined && iv.temperature !== null) $("iv-temp").value = String(iv.temperature);
    }
    state.intervention = read();
  }

  // An edited cell belongs to the prompt it was picked in: a new prompt forgets it.
  function forgetEdit() {
    if (!state.editing) return;
    state.editing = null;
    $("iv-cell").textContent = pickHint;
    state.intervention = read();
  }

  async function apply() {
    state.intervention = read();
    $("iv-note").textContent = note(state.intervention);
    const reset = $("iv-reset-note");
    reset.hidden = true;
    if (state.step && state.intervention) {
      // An intervention changes the prompt's pass, so the generated steps are gone: say so, not silently.
      reset.textContent = `Back at the prompt: the ${state.step} generated step${state.step === 1 ? "" : "s"} ` +
        "came from the pass without this intervention.";
      reset.hidden = false;
      await Generate.reset();
    }
    await Promise.all([Next.load(), Heatmap.load()]);
  }

  // The next-token distribution before and after the intervention: the top candidates of either, and the
  // change in numbers (largest change of a probability, KL divergence).
  function draw() {
    const info = state.info, nextAnswer = state.nextAnswer;
    const box = $("iv-bars"), sum = $("iv-summary");
    box.replaceChildren();
    read();
    if (!state.intervention || !nextAnswer || !nextAnswer.after) {
      glass.next.before = null; glass.next.after = null;
      sum.textContent = state.step && state.intervention ? "Interventions change the prompt's pass: go back to the prompt." : "";
      return;
    }
    const before = glass.next.probs, after = Sampling.tempered(nextAnswer.after, state.temperature);
    glass.next.before = before; glass.next.after = after;
    let kl = 0, maxd = 0;
    for (let i = 0; i < before.length; i++) {
      if (before[i] > 0) kl += after[i] > 0 ? before[i] * (Math.log(before[i]) - Math.log(after[i])) : Infinity;
      maxd = Math.max(maxd, Math.abs(before[i] - after[i]));
    }
    const tb = Sampling.ranked(before, 1)[0], ta = Sampling.ranked(after, 1)[0];
    sum.textContent = `${text(state.intervention)}. Top choice "${info.vocab[tb]}" → ` +
      `"${info.vocab[ta]}"; largest change of a probability ${fmt(maxd)}; KL(before ‖ after) = ` +
      (Number.isFinite(kl) ? `${fmt(kl)} nats.` : "∞ (the intervention gives 0 to a token that had mass).");
    sum.dataset.kl = String(kl); sum.dataset.maxdiff = String(maxd);
    const ids = [...new Set([...Sampling.ranked(before, 6), ...Sampling.ranked(after, 6)])];
    box.append(barColumns("candidate", "before / after (0 … 1)", "before", "after"));
    for (const id of ids) {
      const li = el("li", {class: "bar", "data-id": String(id), "data-before": String(before[id]),
                           "data-after": String(after[id])});
      const track = el("span", {class: "track two"});
      const b = el("span", {class: "fill before"}), a = el("span", {class: "fill after"});
      b.style.width = (100 * before[id]).toFixed(2) + "%";
      a.style.width = (100 * after[id]).toFixed(2) + "%";
      track.append(b, a);
      li.append(el("span", {class: "tick"}, ""), el("span", {class: "piece mono"}, clip(show(info.vocab[id]), 14)), track,
                el("span", {class: "p mono"}, fmt(before[id])), el("span", {class: "q mono"}, fmt(after[id])));
      box.append(li);
    }
  }

  // ---- setting one number
  // Numbers inside the blocks, of the prompt's pass, can be set (not gradients, not the boolean mask).
  // Offline, no new forward pass can run: only the live inspector edits.
  function editable(r) {
    return !Api.embedded && !!r && !r.grad && !r.step && r.layer !== null && r.layer !== undefined &&
      r.local !== "attn.mask";
  }

  // The button names the picked cell, and is off when that cell cannot be set: a gradient, a decoding
  // step, the mask, a view that failed to load, or a future key of the scores or weights (masked by rule).
  function updateEditButton() {
    const b = $("edit-cell"), r = state.snapshot, cursor = state.cell;
    const stale = $("heatmap-wrap").classList.contains("stale");
    const masked = !!cursor && !!r && !!r.mask && !!r.mask[cursor.i * state.layout.cols + cursor.j];
    // A future key of the scores or weights is masked by rule in the pass an edit runs on, even when the
    // view shows it unmasked under "switch off the causal mask" (an edit replaces that intervention).
    const future = !!cursor && !!r && (r.local === "attn.scores" || r.local === "attn.softmax") &&
      cursor.j > (r.start || 0) + cursor.i;
    b.disabled = !cursor || !editable(r) || stale || masked || future;
    b.textContent = cursor ? `Edit cell (${cursor.i}, ${cursor.j})` : "Edit this cell";
    b.title = Api.embedded ? OFFLINE_EDIT
      : future && !masked ? "a future key: masked in the pass an edit runs on (the edit would replace the mask switch)"
      : "set the picked number in the prompt's pass (Intervene); key: E";
  }

  async function editCell() {
    const r = state.snapshot;
    if (!state.cell || $("edit-cell").disabled) return;
    const {i, j} = state.cell;
    let was = r.data[i * state.layout.cols + j], dtype = r.values.dtype;
    if (state.intervention) {
      // The view shows the numbers under the current intervention; the edit replaces it, so ask for the plain one.
      const body = Heatmap.body();
      delete body.intervention;
      try {
        const plain = await Api.ask("snapshot", body);
        was = Api.decode(plain.values)[i * plain.shape[1] + j];
        dtype = plain.values.dtype;
      } catch (e) { /* keep the shown number */ }
    }
    was = precise(was, dtype);      // as the readout shows it: a float32 in its shortest digits, the same bits
    state.editing = {name: r.local, layer: r.layer, head: r.head_axis ? r.head : null, row: i, col: j, was};
    document.querySelector("input[name=iv][value=edit]").checked = true;
    $("iv-value").value = was;
    await apply();   // applied at once (to the number it had: nothing moves yet), so page and panel agree
    $("iv-value").focus();
    $("iv-value").select();
  }

  function build() {
    const info = state.info, c = info.model;
    for (const id of ["iv-layer", "iv-head"]) $(id).replaceChildren();
    for (let l = 0; l < c.n_layers; l++) $("iv-layer").append(el("option", {value: String(l)}, String(l)));
    for (let h = 0; h < c.n_heads; h++) $("iv-head").append(el("option", {value: String(h)}, String(h)));
    document.querySelectorAll("input[name=iv]").forEach((r) => r.addEventListener("change", apply));
    for (const id of ["iv-layer", "iv-head", "iv-temp", "iv-value"]) $(id).addEventListener("change", apply);
    $("edit-cell").addEventListener("click", () => editCell());
    // Escape in the value box goes back to the heatmap, to the cell being edited.
    $("iv-value").addEventListener("keydown", (e) => { if (e.key === "Escape") { e.preventDefault(); $("heatmap").focus(); } });
    if (Api.embedded) {
      const radio = document.querySelector("input[name=iv][value=edit]");
      $("edit-cell").title = radio.parentElement.title = OFFLINE_EDIT;
      radio.disabled = true;
    }
    const off = info.offline;
    if (off && !off.interventions) {
      document.querySelectorAll("input[name=iv]").forEach((r) => { if (r.value !== "none") r.disabled = true; });
      $("iv-note").textContent = `This notebook view holds no interventions: ${off.more_interventions}.`;
      $("iv-note").dataset.fixed = "1";
    }
  }

  return {build, read, set, apply, draw, text, forgetEdit, updateEditButton, editCell};
})();
