// explain.js: the words beside a view: how to read it ("How to read this"), and the equation and the line of
// code that computed it.
//
// The equation and the code come from info.names[i].explain (glassllm.trace.explain): the equation in the
// lessons' notation, and the statement of nn.py whose self.snap(...) call recorded the snapshot, with its
// neighbours. The plain-text equation is typeset here: one-letter symbols in italics, X_sub as a subscript,
// function names upright.
"use strict";

const Explain = (() => {
  function mathNodes(text) {
    const box = el("span", {class: "math"});
    const re = /([A-Za-z]+)(?:_([A-Za-z0-9]+))?/g;
    let at = 0, m;
    while ((m = re.exec(text))) {
      if (m.index > at) box.append(document.createTextNode(text.slice(at, m.index)));
      const word = m[1].length === 1 || m[2] ? el("var", {}, m[1]) : el("span", {class: "fn"}, m[1]);
      box.append(word);
      if (m[2]) box.append(el("sub", {}, m[2]));
      at = re.lastIndex;
    }
    if (at < text.length) box.append(document.createTextNode(text.slice(at)));
    return box;
  }

  // The equation and code line of the heatmap's view, under it (glass.explain).
  function draw(r) {
    const meta = state.names[r.local], x = meta && meta.explain;
    $("explain").hidden = !x;
    if (!x) { glass.explain = null; return; }
    into("explain", meta);
    glass.explain = {name: r.name, local: r.local, equation: x.equation.text, latex: x.equation.latex,
                     path: x.path, line: x.line, code: x.code, function: x.function};
  }

  // The equation, the site and the code with its neighbours of snapshot ``meta`` into #{prefix}-eq, -shape, ...
  function into(prefix, meta) {
    const x = meta.explain;
    const eq = $(prefix + "-eq");
    eq.replaceChildren(...mathNodes(x.equation.text).childNodes);
    eq.title = "LaTeX: " + x.equation.latex;
    eq.dataset.latex = x.equation.latex;
    eq.dataset.text = x.equation.text;
    $(prefix + "-shape").textContent = `(${meta.axes.join(", ")})`;
    $(prefix + "-where").textContent = `${x.path}:${x.line}`;
    $(prefix + "-fn").textContent = x.function;
    // Plain text, the recording statement marked: numbered lines, as an editor shows them.
    const width = String(x.context[x.context.length - 1][0]).length;
    const text = (rows) => rows.map(([n, line]) => String(n).padStart(width) + "  " + line + "\n").join("");
    const code = $(prefix + "-code");
    code.replaceChildren(document.createTextNode(text(x.context.filter(([n]) => n < x.first))),
      el("mark", {class: "site"}, text(x.context.filter(([n]) => n >= x.first && n <= x.last))),
      document.createTextNode(text(x.context.filter(([n]) => n > x.last))));
  }

  // "How to read this" for snapshot answer ``r`` (model config ``c``, scale ``sc``): one string per paragraph.
  function howTo(r, c, sc) {
    const out = [];
    if (r.grad) {
      out.push("This is a gradient, not an activation: each cell says how much the loss −log p(target) would change " +
        "per unit change of that number, holding everything else fixed. Red raises the loss, blue lowers it. " +
        "A large gradient marks sensitivity, not importance: a number can be sensitive and still never change.");
    }
    const oneStep = r.step > 0 && r.shape[0] === 1;
    if (r.axes[1] === "m" && oneStep) {
      out.push(`Axes first: this decoding step has one row, the new query (position ${r.start}, the token just fed ` +
        `back), and one column per key: the ${r.start} cached positions (grey marks above) and its own (orange).`);
      out.push("Masks next: nothing is masked. The new query is the latest position, so every key is in its past " +
        "or is itself; the hatched future keys of the prompt's pass do not exist in this row.");
      if (r.local === "attn.softmax" && !r.grad) out.push("Then the row sum: its weights are a distribution over " +
        "the keys and sum to 1 (the Σ row column).");
      out.push("A bright cell says where this head reads for the next token, not what it retrieves nor whether " +
        "it matters.");
    } else if (r.axes[1] === "m") {
      out.push("Axes first: each row is a query (the position that reads), each column a key (a position it may read). " +
        "Rows go down, keys go right; position numbers follow each token.");
      const off = state.intervention && state.intervention.kind === "mask_off" && !r.step &&
        state.intervention.layer === r.layer;
      if (off) out.push("Masks next: the causal mask is switched off in this layer (Intervene), so queries read " +
        "future keys too. Compare with the mask on: what changes in the next-token distribution?");
      else out.push("Masks next: hatched cells are future keys. Their score was replaced by −∞ before the softmax, so " +
        "their weight is exactly 0 — unlike a cell that is merely pale, which is a small but real weight.");
      if (r.local === "attn.softmax" && !r.grad) {
        out.push("Then row sums: each row of weights is a distribution over the keys and sums to 1 (the Σ row column).");
      }
      if (r.local === "attn.scores") {
        out.push("Scores are q·k / √D before the mask: the hatched cells hold numbers the softmax never sees.");
      }
      out.push("A bright cell says where this head reads, not what it retrieves nor whether it matters: the values, " +
        "W_O, the residual stream and later layers all stand between it and the prediction. " +
        "To test influence, ablate the head (Intervene) and compare the next-token distribution — knowing that " +
        "ablation also moves the model off the inputs it was trained on.");
    } else if (r.col_kind === "vocab") {
      out.push("Rows are positions (one per token), columns are the vocabulary: column j is token id j, and its " +
        "piece is shown when you hover or move to a cell. Row i holds the model's scores (or probabilities) for " +
        "the token that comes after position i.");
      if (!r.grad) out.push(r.local === "probs"
        ? "Each row is a distribution over all ids and sums to 1."
        : "Logits are unnormalised: only their differences within a row matter (the softmax ignores a shift).");
    } else if (r.col_kind === "none" || r.shape[1] === 1) {
      out.push("One number per position (a single column): rows are positions, one per token. Hover a cell, or " +
        "move to it with the arrow keys, for its exact value.");
    } else {
      out.push(`Rows are positions (one per token), columns are the coordinates of the vector at that position. ` +
        "A feature index has no meaning by itself: there is no reason feature 17 should mean anything a person could name.");
      out.push("Hover a cell, or move to it with the arrow keys, for its value.");
    }
    return out;
  }

  return {draw, into, howTo};
})();
