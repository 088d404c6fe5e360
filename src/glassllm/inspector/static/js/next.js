// next.js: the Next token card: the model's next-token distribution at the current step, recomputed here from
// the logits under the temperature, top-k and top-p sliders, as bars and as the full distribution.
"use strict";

const Next = (() => {
  // The next-token request of the current choice.
  function body() {
    const out = {prompt: state.prompt};
    if (state.step) out.step = state.step;
    if (state.intervention && !state.step) out.intervention = state.intervention;
    return out;
  }

  async function load() {
    if (!state.prompt) return;
    await Api.load("next", "next", body(), {
      draw: (r) => {
        state.nextAnswer = {raw: r, logits: Float64Array.from(Api.decode(r.logits)),
                            after: r.after ? Float64Array.from(Api.decode(r.after.logits)) : null};
        state.finished = r.finished;
        const gen = state.ids.length;
        Prompt.drawTokens(r.tokens, gen);
        const where = r.step ? `after step ${r.step} (fed "${r.fed.piece}" at position ${r.position})`
          : `after the prompt's last token "${r.tokens[r.position]}" (position ${r.position})`;
        // The bars are the model's own distribution; an intervention's effect is shown below, before and after.
        $("next-where").textContent = where + (r.after ? " · without the intervention (its effect: Intervene, below)" : "");
        draw();
        Generate.drawStepLine(r);
        Controls.drawModeLine(r.paths);
      },
      fail: (message) => {
        $("next-where").textContent = message;
        if (state.nextAnswer) state.nextAnswer.after = null;    // no stale before/after under a refused intervention
        $("iv-bars").replaceChildren();
        $("iv-summary").textContent = state.intervention ? `Not applied: ${message}` : "";
      },
    });
  }

  function readSampling() {
    const T = Number($("temperature").value);
    const k = Number($("topk").value);
    const p = Number($("topp").value);
    state.temperature = T; state.topK = k > 0 ? k : null; state.topP = p < 1 ? p : null;
    $("temperature-value").textContent = T === 0 ? "0 (greedy)" : T.toFixed(2);
    $("topk-value").textContent = state.topK === null ? "off" : String(k);
    $("topp-value").textContent = state.topP === null ? "off" : p.toFixed(2);
  }

  function onSampling() { readSampling(); if (state.nextAnswer) draw(); }

  function draw() {
    const t0 = performance.now();
    readSampling();
    const info = state.info, z = state.nextAnswer.logits;
    const probs = Sampling.tempered(z, state.temperature);
    const {sampled, survivors} = Sampling.filtered(z, probs, state.topK, state.topP);
    glass.next = {logits: z, probs, sampled, survivors, temperature: state.temperature, topK: state.topK,
                  topP: state.topP, step: state.step};
    const bars = $("bars");
    bars.replaceChildren(barColumns("candidate", "p (track 0 … 1)", "p", "sampled"));
    const top = Sampling.ranked(probs, 12, z);
    const keep = new Set(survivors);
    for (const id of top) {
      const li = el("li", {class: "bar" + (keep.has(id) ? " kept" : " cut"), "data-id": String(id),
                           "data-prob": String(probs[id]), "data-sampled": String(sampled[id])});
      li.title = `id ${id}: logit ${z[id]}; p = ${probs[id]}` + (keep.has(id) ? "" : " (filtered out)");
      const fill = el("span", {class: "fill"});
      fill.style.width = (100 * probs[id]).toFixed(2) + "%";          // absolute: a full track is p = 1
      li.append(el("span", {class: "tick"}, keep.has(id) ? "✓" : "·"),
                el("span", {class: "piece mono"}, clip(show(info.vocab[id]), 14)),
                el("span", {class: "track"}, ""),
                el("span", {class: "p mono"}, fmt(probs[id])),
                el("span", {class: "q mono muted"}, keep.has(id) ? fmt(sampled[id]) : "—"));
      li.querySelector(".track").append(fill);
      if (state.target === id && !state.step) { li.classList.add("picked"); li.setAttribute("aria-pressed", "true"); }
      if (state.mode === "server" && !state.step) {
        li.classList.add("clickable");
        // The gradient of a candidate's loss; from a view that has none (probs, the mask), the nearest that does.
        const pick = () => {
          state.target = id;
          draw();                                            // the picked candidate is marked at once
          Controls.select(state.name === "probs" ? {name: "logits", grad: true}
            : state.name.endsWith("attn.mask") ? {name: "attn.softmax", grad: true} : {grad: true});
        };
        li.addEventListener("click", pick);
        // From the keyboard too: Tab to a candidate, Enter or Space picks it as the gradient's target.
        li.tabIndex = 0;
        li.setAttribute("role", "button");
        li.setAttribute("aria-label", `gradient of the loss of ${show(info.vocab[id])}, p = ${fmt(probs[id])}`);
        li.addEventListener("keydown", (e) => {
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(); }
        });
      }
      bars.append(li);
    }
    $("bars").dataset.survivors = String(survivors.length);
    const note = el("li", {class: "muted small foot"},
      `${nice(survivors.length)} of ${nice(z.length)} candidates survive` +
      (state.mode === "server" && !state.step ? " · click a candidate to see the gradient of its loss" : ""));
    bars.append(note);
    if (!$("all-wrap").hidden) drawAll();
    Interventions.draw();
    glass.lastNextMs = performance.now() - t0;
  }

  function toggleAll() {
    const w = $("all-wrap");
    w.hidden = !w.hidden;
    $("show-all").textContent = w.hidden ? `show the full ${nice(state.info.model.vocab_size)}-way distribution`
      : "hide the full distribution";
    if (!w.hidden) drawAll();
  }

  // Every candidate, most likely first: log10 p as bars, its flat floor explained, and the list.
  function drawAll() {
    const info = state.info, c = $("all-canvas"), wrap = $("all-wrap");
    const probs = glass.next.probs, V = probs.length;
    const order = Sampling.ranked(probs, V, glass.next.logits);
    const W = Math.max(200, wrap.clientWidth), H = 130, dpr = window.devicePixelRatio || 1;
    c.width = W * dpr; c.height = H * dpr; c.style.width = W + "px"; c.style.height = H + "px";
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    // Axis labels sit in their own margin, dark on the page's light paper, never on top of a bar.
    const left = 38, top = 6, bottom = 16, plotW = W - left, plotH = H - top - bottom;
    g.fillStyle = "#fffdf8"; g.fillRect(0, 0, W, H);
    g.fillStyle = "#fbfaf6"; g.fillRect(left, top, plotW, plotH);
    const lo = -12;  // log10 floor: a probability below 1e-12 draws no bar
    const yOf = (lg) => top + plotH * (lg / lo);
    g.font = "11px system-ui, sans-serif"; g.textBaseline = "middle"; g.textAlign = "right";
    for (const lg of [0, -3, -6, -9, -12]) {
      g.strokeStyle = "#e2dccd"; g.beginPath(); g.moveTo(left, yOf(lg) + 0.5); g.lineTo(W, yOf(lg) + 0.5); g.stroke();
      g.fillStyle = "#2b2a27"; g.fillText(lg === 0 ? "1" : `1e${lg}`, left - 5, yOf(lg));
    }
    const keep = new Set(glass.next.survivors);
    for (let r = 0; r < V; r++) {
      const p = probs[order[r]];
      const lg = p > 0 ? Math.max(lo, Math.log10(p)) : lo;
      const h = Math.max(p > 0 ? 1 : 0, top + plotH - yOf(lg));
      g.fillStyle = keep.has(order[r]) ? "#2171b5" : "#c9c3b3";
      g.fillRect(left + (r / V) * plotW, top + plotH - h, Math.max(1, plotW / V), h);
    }
    g.textAlign = "left"; g.textBaseline = "alphabetic"; g.fillStyle = "#2b2a27";
    g.fillText("rank 1", left, H - 3);
    g.textAlign = "right"; g.fillText(`rank ${nice(V)}`, W - 2, H - 3);
    // The floor: the last candidates share nearly one probability (within a factor of 2 of the smallest).
    const least = probs[order[V - 1]];
    let floor = 0;
    while (floor < V && probs[order[V - 1 - floor]] <= 2 * least) floor++;
    $("all-floor").dataset.count = String(floor);
    $("all-floor").textContent = floor >= 0.02 * V
      ? `The flat floor at the right: the last ${nice(floor)} candidates ` +
        `(${(100 * floor / V).toFixed(0)}%) lie within a factor of 2 of the smallest probability, ${least.toExponential(2)}. ` +
        "Most are ids the training text (almost) never contains, such as single bytes of non-English characters: " +
        "training only ever pushed their logits down, together, so they end up at nearly one shared value."
      : `No flat floor here: the probabilities keep falling to the smallest, ${least.toExponential(2)} ` +
        `(${nice(floor)} candidate${floor === 1 ? "" : "s"} within a factor of 2 of it). A model whose training text never ` +
        "contains some ids shows them as a flat floor at the right: training only pushes their logits down, together.";
    c.onmousemove = (ev) => {
      const r = Math.min(V - 1, Math.max(0, Math.floor(((ev.clientX - c.getBoundingClientRect().left - left) / plotW) * V)));
      const id = order[r];
      $("all-readout").textContent = `rank ${r + 1}: id ${id} "${info.vocab[id]}"  p = ${probs[id]}`;
    };
    const list = $("all-list");
    list.replaceChildren();
    const frag = document.createDocumentFragment();
    order.forEach((id, r) => {
      frag.append(el("div", {class: keep.has(id) ? "kept" : "cut", "data-id": String(id), "data-prob": String(probs[id])},
        `${String(r + 1).padStart(4)}  ${String(id).padStart(4)}  ${clip(show(info.vocab[id]), 16).padEnd(16)}  ${probs[id].toExponential(6)}`));
    });
    list.append(frag);
  }

  function build() {
    $("topk").max = String(Math.min(100, state.info.model.vocab_size));
    for (const id of ["temperature", "topk", "topp"]) $(id).addEventListener("input", onSampling);
    $("show-all").addEventListener("click", toggleAll);
  }

  return {build, load, draw, onSampling};
})();
