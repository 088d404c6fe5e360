// compare.js: under an intervention, the heatmap's view before and after it, and their difference, on one
// scale, with a line on what changed (or why nothing did).
"use strict";

const Compare = (() => {
  // Draw the comparison for the view ``asked`` for (``isNewest``: whether that is still the heatmap's newest
  // request); without an intervention, hide it.
  async function update(asked, isNewest) {
    const box = $("compare");
    if (!asked.intervention) { box.hidden = true; glass.compare = null; return; }
    const plainBody = {...asked};
    delete plainBody.intervention;
    let before;
    try {
      before = await Api.ask("snapshot", plainBody);
    } catch (e) {
      box.hidden = true; glass.compare = null; return;
    }
    if (!isNewest()) return;                                   // superseded
    const after = state.snapshot;
    before.data = before.data || Api.decode(before.values);
    before.mask = before.masked ? (before.mask || Api.decode(before.masked)) : null;
    const [rows, cols] = after.shape;
    const diff = new Float64Array(rows * cols);
    let big = 0, at = 0;
    for (let i = 0; i < diff.length; i++) {
      const d = after.data[i] - before.data[i];
      diff[i] = Number.isFinite(d) ? d : 0;                     // −∞ − (−∞) of a masked score: no change
      if (Math.abs(diff[i]) > big) { big = Math.abs(diff[i]); at = i; }
    }
    // Before and after share one scale (the heatmap's, widened to hold both); the difference is symmetric.
    let sc = Paint.scaleFor(after, after.data, after.mask);
    if (sc.note.startsWith("fixed") === false) {
      const other = Paint.scaleFor(after, before.data, before.mask);
      sc = {...sc, lo: Math.min(sc.lo, other.lo), hi: Math.max(sc.hi, other.hi)};
    }
    const dsc = {kind: "div", lo: -(big || 1), hi: big || 1};
    const W = Math.max(90, Math.floor(($("panel-heatmap").clientWidth - 40) / 3));
    const Hpx = Math.max(40, Math.min(220, Math.round(W * rows / cols)));
    Paint.paint($("compare-before"), before.data, rows, cols, before.mask, sc, W, Hpx);
    Paint.paint($("compare-after"), after.data, rows, cols, after.mask, sc, W, Hpx);
    Paint.paint($("compare-diff"), diff, rows, cols, null, dsc, W, Hpx);
    const iv = asked.intervention;
    const own = iv.kind === "ablate" && (after.local === "attn.scores" || after.local === "attn.softmax") &&
      after.layer === iv.layer && after.head === iv.head;
    let note;
    if (own) note = "This is the ablated head's own pattern, and it does not change: ablation zeroes what the head " +
      "writes (its mix), not where it reads. Look at a later layer, or at attn.mix, to see the effect.";
    else if (big === 0) note = "Identical: the forward pass computes this view before the intervention acts.";
    else note = `Changed: the largest |after − before| is ${precise(big, after.values.dtype)}, at row ` +
      `${Math.floor(at / cols)}, column ${at % cols}.`;
    $("compare-note").textContent = note;
    $("compare-scale").textContent = `before and after: the heatmap's colours (${sc.note}); difference: symmetric scale ` +
      `±${fmt(big || 1)}, white is no change, red is larger after, blue smaller.`;
    box.hidden = false;
    glass.compare = {before: before.data, after: after.data, diff, maxAbs: big, rows, cols, own};
  }

  return {update};
})();
