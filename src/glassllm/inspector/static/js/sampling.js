// sampling.js: the next-token distribution as glassllm.sampling computes it: softmax(logits / T), the
// survivors of top-k then top-p, and the ranking of candidates. Pure functions of the logits.
"use strict";

const Sampling = (() => {
  // softmax(logits / T) over every id, as glassllm.sampling computes it (T = 0: all mass on the first arg-max).
  function tempered(z, T) {
    const V = z.length, p = new Float64Array(V);
    let peak = -Infinity, arg = 0;
    for (let i = 0; i < V; i++) if (z[i] > peak) { peak = z[i]; arg = i; }
    if (T === 0) { p[arg] = 1; return p; }
    let s = 0;
    for (let i = 0; i < V; i++) { p[i] = Math.exp((z[i] - peak) / T); s += p[i]; }
    for (let i = 0; i < V; i++) p[i] /= s;
    return p;
  }

  // The ids that survive top-k then top-p, and the renormalised distribution (glassllm.sampling's rules).
  function filtered(z, probs, topK, topP) {
    const V = z.length;
    const keep = new Uint8Array(V);
    for (let i = 0; i < V; i++) keep[i] = probs[i] > 0 ? 1 : 0;
    if (topK !== null && topK < V) {
      const sorted = Float64Array.from(z).sort().reverse();
      const kth = sorted[topK - 1];
      for (let i = 0; i < V; i++) if (!(z[i] >= kth)) keep[i] = 0;
    }
    if (topP !== null && topP < 1) {
      const q = new Float64Array(V);
      let s = 0;
      for (let i = 0; i < V; i++) if (keep[i]) q[i] = probs[i];
      for (let i = 0; i < V; i++) s += q[i];
      for (let i = 0; i < V; i++) q[i] /= s;
      const order = Array.from({length: V}, (_, i) => i).sort((a, b) => q[b] - q[a] || a - b);
      let cum = 0;
      const nucleus = new Uint8Array(V);
      order.forEach((id, r) => {
        const above = r === 0 ? 0 : cum;   // mass ranked above this id
        if (above < topP) nucleus[id] = 1;
        cum += q[id];
      });
      for (let i = 0; i < V; i++) keep[i] &= nucleus[i];
    }
    const out = new Float64Array(V);
    let s = 0;
    for (let i = 0; i < V; i++) if (keep[i]) out[i] = probs[i];
    for (let i = 0; i < V; i++) s += out[i];
    for (let i = 0; i < V; i++) out[i] /= s;
    const survivors = [];
    for (let i = 0; i < V; i++) if (keep[i]) survivors.push(i);
    survivors.sort((a, b) => out[b] - out[a] || a - b);
    return {sampled: out, survivors};
  }

  // The k most likely ids; equal probabilities (all 0 at temperature 0) are ordered by logit, then by id.
  function ranked(p, k, z = null) {
    const idx = Array.from({length: p.length}, (_, i) => i);
    idx.sort((a, b) => p[b] - p[a] || (z ? z[b] - z[a] : 0) || a - b);
    return idx.slice(0, k);
  }

  return {tempered, filtered, ranked};
})();
