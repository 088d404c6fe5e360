// training.js: the Training tab, for a model whose run kept its probe history: the probe (a span written
// twice) at log-spaced steps: a step slider beside the loss curve and each head's induction score; the L x H
// patterns, the sample and the next-token guess at the chosen step. glass.timeline holds what is shown.
"use strict";

const Training = (() => {
  let timeline = null;               // the run's history, decoded, once asked for

  async function open() {
    if (!state.info.timeline) return;
    if (timeline) { showStep(Number($("tl-slider").value)); return; }
    const box = $("panel-training");
    await Api.load("training", "timeline", {}, {
      draw: (r) => {
        timeline = {...r, attn: Api.decode(r.attn), probs: Api.decode(r.probs), induction: Api.decode(r.induction)};
        build(box);
        showStep(Number($("tl-slider").value));
      },
      fail: (message) => box.replaceChildren(el("p", {class: "error"}, message)),
    });
  }

  function build(box) {
    const t = timeline, S = t.steps.length, P = t.period;
    const probe = t.pieces.slice(0, P).join("");
    box.replaceChildren();
    box.append(
      el("p", {class: "muted small"}, `The run that trained this model looked at one probe prompt again and again: ` +
        `${JSON.stringify(probe)} (${P} tokens) written twice, at ${S} steps from 0 (the random start) to ` +
        `${nice(t.steps[S - 1])}, spaced evenly on a log scale. Move the slider to see what the model did with the ` +
        "probe at that step."),
      el("div", {class: "tl-charts"}),
      el("div", {class: "row tl-slider-row"}),
      el("p", {id: "tl-row", class: "mono small"}),
      el("div", {class: "tl-body"}),
    );
    const charts = box.querySelector(".tl-charts");
    for (const [id, label] of [["tl-loss", "loss (nats/token): training, and held-out (dots)"],
                               ["tl-induction", "induction score of each head (one line per head)"]]) {
      const fig = el("figure");
      fig.append(el("figcaption", {class: "small muted"}, label), el("canvas", {id}));
      charts.append(fig);
    }
    const row = box.querySelector(".tl-slider-row");
    const slider = el("input", {id: "tl-slider", type: "range", min: "0", max: String(S - 1), step: "1",
                                value: String(S - 1)});
    slider.setAttribute("aria-label", "training step");
    slider.addEventListener("input", () => showStep(Number(slider.value)));
    row.append(el("label", {htmlFor: "tl-slider", class: "label"}, "step"), slider, el("b", {id: "tl-step", class: "mono"}));
    const body = box.querySelector(".tl-body");
    const left = el("div"), right = el("div", {class: "tl-side"});
    left.append(el("p", {class: "small muted", id: "tl-grid-title"}), el("div", {id: "tl-grid", class: "head-grid"}));
    right.append(el("p", {class: "small muted", id: "tl-head-title"}), el("canvas", {id: "tl-head"}),
                 el("p", {id: "tl-best", class: "small"}), el("p", {class: "label"}, "next token after the probe"),
                 el("ol", {id: "tl-next", class: "bars tl-bars"}), el("p", {class: "label"}, "sample at this step"),
                 el("p", {id: "tl-sample", class: "mono small tl-sample"}));
    body.append(left, right);
    const legend = el("div", {class: "legend"});
    legend.append(el("canvas", {id: "tl-legend-bar", width: 240, height: 14}), el("span", {class: "mono small"}, "0"),
                  el("span", {class: "mono small"}, "1"), el("span", {id: "tl-legend-note", class: "small muted"}, TL_SCALE.note),
                  el("span", {class: "legend-item"}, ""));
    legend.lastChild.append(el("i", {class: "swatch masked"}), "masked: forbidden key");
    const howto = el("details", {class: "howto", open: true});
    const scale = el("p", {id: "tl-howto-scale"}, "Colour: ");
    scale.append(el("b", {}, TL_SCALE.note), ".");
    howto.append(el("summary", {}, "How to read this"),
      el("p", {}, `Induction score: a head that copies reads, from each token of the second copy, the token just ` +
        `after that token's first occurrence (query i reads key i − ${P - 1}, outlined in the pattern on the right). ` +
        "The score is that weight averaged over the second copy: about 1 / position for a head that spreads its " +
        "weight evenly, near 1 for an induction head."),
      el("p", {}, "Watch the loss curve and the scores together: an induction head tends to appear in a short span " +
        "of steps, and the loss on text that repeats drops with it."),
      scale);
    box.append(legend, howto);
    Paint.scaleBar($("tl-legend-bar"), TL_SCALE);
    t.selected = bestHead(S - 1);
  }

  const TL_SCALE = {kind: "seq", lo: 0, hi: 1, note: "fixed scale 0 … 1: white is 0, darkest blue is 1"};

  // The head with the highest induction score at step index s: {layer, head, score}.
  function bestHead(s) {
    const t = timeline, L = state.info.model.n_layers, H = state.info.model.n_heads;
    let best = {layer: 0, head: 0, score: -1};
    for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
      const v = t.induction[(s * L + l) * H + h];
      if (v > best.score) best = {layer: l, head: h, score: v};
    }
    return best;
  }

  function showStep(s) {
    const t = timeline, L = state.info.model.n_layers, H = state.info.model.n_heads, n = t.ids.length, P = t.period;
    const row = t.rows[s];
    $("tl-step").textContent = `${nice(t.steps[s])} (${s + 1} of ${t.steps.length})`;
    const parts = [`step ${nice(row.step)}`, `${nice(row.tokens)} tokens seen`];
    // The rate of the step that led here; the first model has none.
    parts.push(row.lr === null || row.lr === undefined ? "no step yet" : `lr ${row.lr.toExponential(3)}`);
    if (row.train_loss !== null && row.train_loss !== undefined) parts.push(`training loss ${row.train_loss.toFixed(3)}`);
    parts.push(row.val_loss === null || row.val_loss === undefined ? "no held-out text"
      : `held-out loss ${row.val_loss.toFixed(3)} nats/token (${row.val_bpb.toFixed(3)} bits/byte)`);
    $("tl-row").textContent = parts.join(" · ");
    const best = bestHead(s);
    $("tl-best").textContent = `Highest induction score at this step: layer ${best.layer}, head ${best.head}, ` +
      `${best.score.toFixed(3)}.`;
    $("tl-best").dataset.score = String(best.score);
    $("tl-sample").textContent = row.sample || "(no sample)";

    // All heads at this step, one colour scale; a click picks the head shown large.
    const grid = $("tl-grid");
    const size = Math.max(40, Math.min(110, Math.floor((grid.clientWidth - 70) / H) - 8));
    grid.style.gridTemplateColumns = `auto repeat(${H}, ${size + 6}px)`;
    const mask = new Uint8Array(n * n);
    for (let i = 0; i < n; i++) for (let j = i + 1; j < n; j++) mask[i * n + j] = 1;
    const cells = [el("span")];
    for (let h = 0; h < H; h++) cells.push(el("span", {class: "label"}, `head ${h}`));
    const at = (l, h) => t.attn.subarray(((s * L + l) * H + h) * n * n, ((s * L + l) * H + h + 1) * n * n);
    for (let l = 0; l < L; l++) {
      cells.push(el("span", {class: "label"}, `layer ${l}`));
      for (let h = 0; h < H; h++) {
        const b = el("button", {type: "button", class: "thumb", "data-layer": String(l), "data-head": String(h)});
        const score = t.induction[(s * L + l) * H + h];
        b.title = `layer ${l}, head ${h}: induction score ${score.toFixed(3)}`;
        b.classList.toggle("picked", l === t.selected.layer && h === t.selected.head);
        const cv = el("canvas");
        Paint.paint(cv, at(l, h), n, n, mask, TL_SCALE, size, size);
        b.append(cv);
        b.addEventListener("click", () => { t.selected = {layer: l, head: h}; showStep(Number($("tl-slider").value)); });
        cells.push(b);
      }
    }
    grid.replaceChildren(...cells);
    $("tl-grid-title").textContent = `Every layer and head on the probe at step ${nice(row.step)}; click one to see it large.`;

    // The chosen head, large (as wide as its column, at most 300 px), with the induction cells outlined.
    const {layer, head} = t.selected;
    const big = $("tl-head"), side = Math.max(160, Math.min(300, big.parentElement.clientWidth));
    Paint.paint(big, at(layer, head), n, n, mask, TL_SCALE, side, side);
    const g = big.getContext("2d"), c = side / n;
    g.strokeStyle = "#e8871e"; g.lineWidth = 1;
    for (let i = P; i < n; i++) g.strokeRect((i - P + 1) * c + 0.5, i * c + 0.5, Math.max(1, c - 1), Math.max(1, c - 1));
    $("tl-head-title").textContent = `layer ${layer}, head ${head} at step ${nice(row.step)} (induction score ` +
      `${t.induction[(s * L + layer) * H + head].toFixed(3)}; orange: the cells it scores)`;

    // The next-token guess after the probe: three columns (piece, track, p), so that the track keeps its
    // width in the side column of a narrow window.
    const probs = t.probs.subarray(s * state.info.model.vocab_size, (s + 1) * state.info.model.vocab_size);
    const list = $("tl-next"), cols = el("li", {class: "cols small muted"});
    cols.append(el("span", {}, "candidate"), el("span", {}, "p (track 0 … 1)"), el("span", {class: "p"}, "p"));
    list.replaceChildren(cols);
    for (const id of Sampling.ranked(probs, 5)) {
      const li = el("li", {class: "bar", "data-id": String(id)});
      const track = el("span", {class: "track"}), fill = el("span", {class: "fill"});
      fill.style.width = (100 * probs[id]).toFixed(2) + "%";
      track.append(fill);
      li.append(el("span", {class: "piece mono"}, clip(show(state.info.vocab[id]), 14)), track,
                el("span", {class: "p mono"}, fmt(probs[id])));
      list.append(li);
    }
    drawCurves(s);
    glass.timeline = {index: s, step: row.step, selected: {...t.selected}, pattern: Array.from(at(layer, head)),
                      best, scores: Array.from(t.induction)};
  }

  // Loss and induction scores against log(step + 1), with the chosen step marked on both.
  function drawCurves(s) {
    const t = timeline, L = state.info.model.n_layers, H = state.info.model.n_heads, S = t.steps.length;
    const last = Math.max(1, t.steps[S - 1], ...t.history.map((r) => r.step));
    const xOf = (step, W) => 34 + (W - 40) * Math.log1p(step) / Math.log1p(last);
    const setup = (id) => {
      const c = $(id), W = Math.max(220, Math.floor(($("panel-training").clientWidth - 30) / 2)), Hh = 140;
      const dpr = window.devicePixelRatio || 1;
      c.width = W * dpr; c.height = Hh * dpr; c.style.width = W + "px"; c.style.height = Hh + "px";
      const g = c.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.fillStyle = "#fbfaf6"; g.fillRect(0, 0, W, Hh);
      g.font = "11px system-ui, sans-serif"; g.fillStyle = "#2b2a27";
      return {g, W, Hh};
    };
    const axes = (g, W, Hh, lo, hi, yOf) => {
      g.textAlign = "right"; g.textBaseline = "middle";
      for (const v of [lo, (lo + hi) / 2, hi]) g.fillText(v.toFixed(v < 10 ? 1 : 0), 30, yOf(v));
      g.textAlign = "left"; g.textBaseline = "alphabetic";
      g.fillText("step 0", 34, Hh - 2);
      g.textAlign = "right"; g.fillText(`${nice(last)} (log scale)`, W - 4, Hh - 2);
      const x = xOf(t.steps[s], W);
      g.strokeStyle = "#e8871e"; g.lineWidth = 2; g.beginPath(); g.moveTo(x, 6); g.lineTo(x, Hh - 14); g.stroke();
    };

    // Loss curve.
    {
      const {g, W, Hh} = setup("tl-loss");
      const pts = t.history.filter((r) => Number.isFinite(r.loss));
      const vals = pts.map((r) => r.loss).concat(t.history.filter((r) => r.val_loss !== null && r.val_loss !== undefined)
        .map((r) => r.val_loss));
      const hi = vals.length ? Math.ceil(Math.max(...vals)) : 1, lo = vals.length ? Math.floor(Math.min(...vals)) : 0;
      const yOf = (v) => 8 + (Hh - 24) * (hi - v) / ((hi - lo) || 1);
      g.strokeStyle = "#2171b5"; g.lineWidth = 1.5; g.beginPath();
      pts.forEach((r, i) => (i ? g.lineTo : g.moveTo).call(g, xOf(r.step, W), yOf(r.loss)));
      g.stroke();
      g.fillStyle = "#b2182b";
      for (const r of t.history) if (r.val_loss !== null && r.val_loss !== undefined) {
        g.beginPath(); g.arc(xOf(r.step, W), yOf(r.val_loss), 2.5, 0, 2 * Math.PI); g.fill();
      }
      g.fillStyle = "#2b2a27";
      axes(g, W, Hh, lo, hi, yOf);
    }
    // Induction scores: one faint line per head, the best head of the last step in full colour.
    {
      const {g, W, Hh} = setup("tl-induction");
      const yOf = (v) => 8 + (Hh - 24) * (1 - v);
      const top = bestHead(S - 1);
      for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
        const star = l === top.layer && h === top.head;
        g.strokeStyle = star ? "#b2182b" : "rgba(33, 113, 181, 0.35)"; g.lineWidth = star ? 2 : 1;
        g.beginPath();
        for (let k = 0; k < S; k++) {
          const x = xOf(t.steps[k], W), y = yOf(t.induction[(k * L + l) * H + h]);
          if (k) g.lineTo(x, y); else g.moveTo(x, y);
        }
        g.stroke();
      }
      g.fillStyle = "#b2182b"; g.textAlign = "left";
      g.fillText(`layer ${top.layer}, head ${top.head}`, 38, 16);
      g.fillStyle = "#2b2a27";
      axes(g, W, Hh, 0, 1, yOf);
    }
  }

  return {open};
})();
