// state.js: the page's one state object, and `glass`, the hook that shows it (and the numbers on the page)
// to tests and tools.
//
// `state` holds what the reader chose (prompt, layer, snapshot, head, value or gradient, step, sampling,
// intervention, tab) and what the page holds for those choices (the model's description, the snapshot on
// show, the next-token logits, the picked cell). Every script reads and writes the page's state here and
// nowhere else; a feature's private bookkeeping (the step-through's timer, say) stays in its own script.
"use strict";

const state = {
  // What the reader chose.
  mode: null,                      // where the answers come from: "server" or "export" (set by api.js)
  prompt: "", ids: [], pieces: [], layer: 0, name: "attn.softmax", head: 0, grad: false,
  step: 0, temperature: 1, topK: null, topP: null, intervention: null, target: null, error: null, query: null,
  busy: 0, rendered: 0, tab: "heatmap", finished: null,
  // What the page holds for it.
  info: null,                      // /api/info: the model, its snapshot names, the vocabulary
  names: {},                       // local name -> {axes, in_layer, head_axis, heads, group, explain, held}
  snapshot: null,                  // the snapshot answer the heatmap shows (with .data and .mask decoded)
  nextAnswer: null,                // {raw, logits, after?} of the current step's next-token answer
  layout: null,                    // where the heatmap's last drawing put its cells: {x0, y0, cw, ch, rows, cols}
  cell: null,                      // the heatmap cell last picked, {i, j}: where the arrow keys move from
  editing: null,                   // the cell being edited: {name, layer, head, row, col, was}
};

// The page's state and the numbers it shows, exposed so tests can check them exactly: glass.state,
// glass.heatmap (cell values, geometry), glass.next (logits, probs), ... main.js adds the methods that
// drive the page as its controls do (glass.select, glass.run, glass.step, ...).
const glass = {state, timings: [], heatmap: null, next: null, lens: null, attribution: null};
window.glass = glass;
