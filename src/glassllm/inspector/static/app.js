// glassllm inspector: the page. Vanilla JS, canvas rendering, nothing fetched from a network.
//
// Data comes through one interface, `source.get(kind, body)`, answered either by the local
// server (POST /api/<kind>) or, in an exported HTML file, by responses embedded in the page
// under the same canonical request keys (see schema.request_key in Python).
//
// The page's state and the numbers it shows are exposed as `window.glass` so tests can check
// them exactly: glass.state, glass.heatmap (cell values, geometry), glass.next (logits, probs).
"use strict";

(function () {
  // ------------------------------------------------------------------ data source
  const embeddedNode = document.getElementById("glass-data");
  const embedded = embeddedNode ? JSON.parse(embeddedNode.textContent) : null;

  // Canonical key of a request: fields that differ from their defaults, keys sorted, no spaces.
  function canon(x) {
    if (Array.isArray(x)) return x.map(canon);
    if (x && typeof x === "object") {
      const out = {};
      for (const k of Object.keys(x).sort()) if (x[k] !== undefined) out[k] = canon(x[k]);
      return out;
    }
    return x;
  }
  function requestKey(kind, body) { return kind + ":" + JSON.stringify(canon(body)); }

  const cache = new Map();           // request key -> response (least recently used first)
  const CACHE_LIMIT = 96;

  const source = embedded ? {
    mode: "export",
    async info() { return embedded.info; },
    async get(kind, body) {
      let r = embedded.responses[requestKey(kind, body)];
      // A snapshot the forward pass computes before the intervened one holds the same numbers with and
      // without the intervention: the export's plain view is the answer.
      if (!r && kind === "snapshot" && body.intervention && !body.grad && upstream(body, body.intervention)) {
        const plain = {...body};
        delete plain.intervention;
        r = embedded.responses[requestKey(kind, plain)];
      }
      if (!r) throw new Error("not included in this offline export: run `glassllm inspect` for every view");
      if (r.error) throw new Error(r.error);
      return r;
    },
  } : {
    mode: "server",
    async info() { return fetchJSON("GET", "api/info"); },
    async get(kind, body) { return fetchJSON("POST", "api/" + kind, body); },
  };

  // A busy server (503) or too many requests from this browser (429) says when to come back:
  // the page says "busy, retrying", waits that long and asks again.
  const RETRIES = 10;
  function busyNote(text) {
    let note = $("busy-line");
    if (!note) { note = el("p", {id: "busy-line", class: "muted small", role: "status"}); $("model-line").after(note); }
    note.textContent = text;
    note.hidden = !text;
  }

  async function fetchJSON(method, url, body) {
    let r;
    for (let attempt = 0; ; attempt++) {
      try {
        r = await fetch(url, {
          method, headers: body ? {"Content-Type": "application/json"} : {},
          body: body ? JSON.stringify(body) : undefined,
        });
      } catch (e) {                    // no answer at all: the server process is gone
        throw new Error("the inspector's server is not answering (was it stopped?); start `glassllm inspect` again");
      }
      if ((r.status !== 503 && r.status !== 429) || attempt >= RETRIES) break;
      const wait = Math.min(30, Math.max(1, Number(r.headers.get("Retry-After")) || 1));
      busyNote(`busy, retrying in ${wait} s…`);
      await new Promise((res) => setTimeout(res, wait * 1000));
    }
    busyNote("");
    let data;
    try { data = await r.json(); } catch (e) { throw new Error(`server answered ${r.status} without JSON`); }
    if (!r.ok) throw new Error(data.error || `server answered ${r.status}`);
    return data;
  }

  async function ask(kind, body) {
    const key = requestKey(kind, body);
    if (cache.has(key)) { const v = cache.get(key); cache.delete(key); cache.set(key, v); return v; }
    const v = await source.get(kind, body);
    cache.set(key, v);
    while (cache.size > CACHE_LIMIT) cache.delete(cache.keys().next().value);
    return v;
  }

  // Exact binary arrays: {dtype, shape, b64} -> typed array (little-endian, as every browser is).
  function decode(enc) {
    const bin = atob(enc.b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    if (enc.dtype === "float32") return new Float32Array(bytes.buffer);
    if (enc.dtype === "float64") return new Float64Array(bytes.buffer);
    return bytes;
  }

  // ------------------------------------------------------------------ small helpers
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs = {}, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
    }
    if (text !== undefined) e.textContent = text;
    return e;
  };
  // A token piece, made visible: spaces as ␣, nothing else changed.
  const show = (piece) => piece.replace(/ /g, "␣");
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);
  const fmt = (v, d = 4) => {
    if (!Number.isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(d - 1);
    return v.toFixed(d);
  };
  const nice = (n) => n.toLocaleString("en-US");
  const AXIS_NAMES = {
    n: "query position", m: "key position", C: "feature (C)", D: "head feature (D)", F: "MLP unit (F)",
    V: "vocabulary id (V)", "": "",
  };

  // ------------------------------------------------------------------ state
  const state = {
    mode: source.mode, prompt: "", ids: [], pieces: [], layer: 0, name: "attn.softmax", head: 0, grad: false,
    step: 0, temperature: 1, topK: null, topP: null, intervention: null, target: null, error: null,
    busy: 0, rendered: 0,
  };
  let info = null;
  let names = {};                    // local name -> {axes, in_layer, head_axis, heads, group}

  // Does the forward pass compute snapshot (name, layer) of ``view`` strictly before the one ``iv`` changes?
  // info.names is in forward order: embed, one layer's names, then the final norm and the logits.
  function upstream(view, iv) {
    // (mask_off: the scores view draws the mask over itself, so it counts as changed too)
    const target = {ablate: "attn.mix", mask_off: "attn.scores", temperature: "attn.scores"}[iv.kind] ?? iv.name;
    const order = info.names.map((n) => n.name);
    const place = (name, layer) => {
      const i = order.indexOf(name), meta = info.names[i];
      if (i < 0) return null;
      return meta.in_layer ? [layer ?? 0, i] : name === "embed" ? [-1, i] : [Infinity, i];
    };
    const a = place(view.name, view.layer), b = place(target, iv.layer);
    return !!a && !!b && (a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]));
  }
  let current = null;                // the snapshot response being shown
  let nextData = null;               // {logits, after?} of the current step
  const glass = {
    state, requestKey, timings: [],
    heatmap: null, next: null,
    // Select layer / snapshot / head / gradient, like the page's controls; resolves once drawn.
    async select(sel) { Object.assign(state, normalizeSelection(sel)); syncControls(); await loadView(); },
    async run(prompt) { $("prompt").value = prompt; await runPrompt(); },
    async setTemperature(T) { $("temperature").value = String(T); onSampling(); },
    async step() { await doStep(); },
    async reset() { await resetSteps(); },
    async intervene(iv) { setIntervention(iv); await onIntervention(); },
    idle() { return idlePromise(); },
  };
  window.glass = glass;

  let waiters = [];
  function idlePromise() {
    if (state.busy === 0) return Promise.resolve();
    return new Promise((res) => waiters.push(res));
  }
  async function busy(fn) {
    state.busy++;
    try { return await fn(); } finally {
      state.busy--;
      if (state.busy === 0) { const w = waiters; waiters = []; w.forEach((f) => f()); }
    }
  }

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
    const before = names[state.name];
    if (before && before.heads) heads[before.head_axis] = state.head;   // remember the head being left
    const meta = names[out.name ?? state.name];
    if (!meta || !meta.heads) return out;
    const axis = meta.head_axis;
    if (out.head !== undefined && out.head !== null) heads[axis] = out.head;
    else if (axis === "G" && lastAxis === "H") heads.G = Math.floor(heads.H / info.model.n_heads * info.model.n_kv_heads);
    lastAxis = axis;
    out.head = Math.min(heads[axis], meta.heads - 1);
    return out;
  }

  // ------------------------------------------------------------------ controls
  const plural = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;

  function buildControls() {
    const c = info.model;
    $("model-line").textContent =
      `${plural(c.n_layers, "layer")} · width C = ${c.dim} · ${plural(c.n_heads, "query head")} sharing ` +
      `${plural(c.n_kv_heads, "key/value head")} ` +
      `of size D = ${c.head_dim} · MLP F = ${c.ffn_dim} · vocabulary V = ${nice(c.vocab_size)} · ` +
      `context ${c.max_seq_len} · ${nice(c.params)} parameters (${c.dtype})` +
      (info.meta.step ? ` · trained ${nice(Number(info.meta.step))} steps` : "") +
      (info.meta.valid_loss ? `, held-out loss ${Number(info.meta.valid_loss).toFixed(3)} nats/token` : "");
    $("mode-line").textContent = state.mode === "export" ? "offline export: one prompt, precomputed" : "live: local server";
    document.querySelectorAll(".vocab-n").forEach((e) => (e.textContent = nice(c.vocab_size)));

    const layers = $("layers");
    layers.replaceChildren();
    for (let l = 0; l < c.n_layers; l++) {
      const b = el("button", {type: "button", "data-layer": String(l), role: "radio"}, String(l));
      b.addEventListener("click", () => userSelect({layer: l}));
      layers.append(b);
    }
    const select = $("snapshot");
    select.replaceChildren();
    const groups = new Map();
    for (const n of info.names) {
      names[n.name] = n;
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

    for (const id of ["iv-layer", "iv-head"]) $(id).replaceChildren();
    for (let l = 0; l < c.n_layers; l++) $("iv-layer").append(el("option", {value: String(l)}, String(l)));
    for (let h = 0; h < c.n_heads; h++) $("iv-head").append(el("option", {value: String(h)}, String(h)));
    document.querySelectorAll("input[name=iv]").forEach((r) => r.addEventListener("change", onIntervention));
    for (const id of ["iv-layer", "iv-head", "iv-temp", "iv-value"]) $(id).addEventListener("change", onIntervention);
    $("edit-cell").addEventListener("click", () => editCell());
    // Escape in the value box goes back to the heatmap, to the cell being edited.
    $("iv-value").addEventListener("keydown", (e) => { if (e.key === "Escape") { e.preventDefault(); $("heatmap").focus(); } });
    if (embedded) {
      $("edit-cell").title = "setting a number needs a new forward pass: run glassllm inspect";
      document.querySelector("input[name=iv][value=edit]").disabled = true;
    }

    $("topk").max = String(Math.min(100, c.vocab_size));
    for (const id of ["temperature", "topk", "topp"]) $(id).addEventListener("input", onSampling);
    $("show-all").addEventListener("click", toggleAll);
    $("step").addEventListener("click", () => doStep());
    $("reset").addEventListener("click", () => resetSteps());
    $("prompt-form").addEventListener("submit", (e) => { e.preventDefault(); runPrompt(); });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); runPrompt(); }
    });
    const canvas = $("heatmap");
    canvas.addEventListener("mousemove", onHover);
    canvas.addEventListener("click", onCellClick);   // a click picks the cell (for editing), as the arrow keys do
    canvas.addEventListener("mouseleave", hideCell);
    canvas.addEventListener("keydown", onCellKey);   // the canvas takes the focus (tabindex 0): arrows walk its cells
    canvas.addEventListener("blur", hideCell);
    // Redraw when the width changes (the layout depends on it), not on every height change.
    let width = window.innerWidth;
    window.addEventListener("resize", () => {
      if (current && window.innerWidth !== width) { width = window.innerWidth; draw(); }
    });
  }

  function syncControls() {
    const c = info.model;
    const meta = names[state.name];
    $("layers").querySelectorAll("button").forEach((b) => {
      b.classList.toggle("on", Number(b.dataset.layer) === state.layer);
      b.setAttribute("aria-checked", String(Number(b.dataset.layer) === state.layer));
      b.disabled = !meta.in_layer;
    });
    $("snapshot").value = state.name;
    const heads = $("heads");
    const hadFocus = heads.contains(document.activeElement);            // rebuilding must not drop the focus
    heads.replaceChildren();
    if (meta.heads) {
      for (let h = 0; h < meta.heads; h++) {
        const b = el("button", {type: "button", "data-head": String(h), role: "radio"}, String(h));
        b.classList.toggle("on", h === state.head);
        b.setAttribute("aria-checked", String(h === state.head));
        b.addEventListener("click", () => userSelect({head: h}));
        heads.append(b);
      }
      if (hadFocus) heads.querySelector(`button[data-head="${state.head}"]`).focus();
      const rep = c.n_heads / c.n_kv_heads;
      const kind = meta.head_axis === "H"
        ? `${c.n_heads} query heads · head ${state.head} reads key/value head ${Math.floor(state.head / rep)}`
        : `${c.n_kv_heads} key/value heads · head ${state.head} serves query heads ${state.head * rep}–${state.head * rep + rep - 1}`;
      heads.append(el("span", {class: "muted small"}, kind));
    } else {
      heads.append(el("span", {class: "muted small"}, "this snapshot has no head axis"));
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
  }

  // One Tab stop per group of radio buttons: the chosen one (or the first that can be chosen); the arrow
  // keys move within the group. So Tab goes layer -> head -> value/gradient -> heatmap, not button by button.
  function rove(group) {
    const buttons = [...group.querySelectorAll("button")];
    const stop = buttons.find((b) => b.classList.contains("on") && !b.disabled) || buttons.find((b) => !b.disabled);
    for (const b of buttons) b.tabIndex = b === stop ? 0 : -1;
  }

  function userSelect(sel) {
    const t0 = performance.now();
    Object.assign(state, normalizeSelection(sel));
    syncControls();
    return loadView().then(() => glass.timings.push({what: Object.keys(sel).join(","), ms: performance.now() - t0}));
  }

  // ------------------------------------------------------------------ prompt and tokens
  let promptSeq = 0;
  async function runPrompt() {
    // Offline, the one embedded prompt as it was (a textarea would turn its "\r\n" into "\n").
    const text = embedded ? embedded.prompt : $("prompt").value;
    const seq = ++promptSeq;
    state.error = null;
    await busy(async () => {
      try {
        const t = await ask("tokens", {prompt: text});
        if (seq !== promptSeq) return;                      // a newer prompt was submitted
        if (text !== state.prompt) state.target = null;
        if (text !== state.prompt && editing) {              // an edited cell belongs to the prompt it was picked in
          editing = null;
          $("iv-cell").textContent = pickHint;
          state.intervention = readIntervention();
        }
        state.prompt = text; state.ids = t.ids; state.pieces = t.pieces; state.step = 0;
        state.finished = null;
        $("prompt-note").textContent = `${t.ids.length} token${t.ids.length === 1 ? "" : "s"}` + (state.mode === "export"
          ? " · this offline page holds one prompt; run `glassllm inspect` to try others" : "");
        $("prompt-note").classList.remove("error");
      } catch (e) {
        if (seq !== promptSeq) return;
        $("prompt-note").textContent = e.message + " (the views below still show the previous prompt)";
        $("prompt-note").classList.add("error");
        return;
      }
      syncControls();
      await Promise.all([loadView(), loadNext()]);
    });
  }

  function drawTokens(pieces, generatedFrom) {
    const box = $("tokens");
    box.replaceChildren();
    pieces.forEach((p, i) => {
      const chip = el("span", {class: "tok" + (i >= generatedFrom ? " gen" : ""), "data-pos": String(i)});
      chip.append(el("b", {}, show(p)), el("small", {}, String(i)));
      chip.title = `position ${i}${i >= generatedFrom ? " (generated)" : ""}`;
      box.append(chip);
    });
  }

  // ------------------------------------------------------------------ the heatmap
  function snapshotBody() {
    const meta = names[state.name];
    const body = {prompt: state.prompt, name: state.name};
    if (meta.in_layer) body.layer = state.layer;
    if (meta.heads) body.head = state.head;
    if (state.step) body.step = state.step;
    if (state.grad && !state.step) body.grad = true;
    if (state.grad && !state.step && state.target !== null) body.target = state.target;
    if (state.intervention && !state.step) body.intervention = state.intervention;
    return body;
  }

  async function loadView() {
    if (!state.prompt) return;
    await busy(async () => {
      const body = snapshotBody();
      try {
        const r = await ask("snapshot", body);
        if (requestKey("snapshot", snapshotBody()) !== requestKey("snapshot", body)) return; // superseded
        current = r;
        current.data = current.data || decode(r.values);
        current.mask = r.masked ? (current.mask || decode(r.masked)) : null;
        $("view-error").hidden = true;
        $("heatmap-wrap").classList.remove("stale");
        draw();
      } catch (e) {
        if (requestKey("snapshot", snapshotBody()) !== requestKey("snapshot", body)) return; // superseded
        // The heatmap and its heading would describe the previous view: say so, and grey it out.
        $("view-error").textContent = e.message;
        $("view-error").hidden = false;
        const kv = /^attn\.(k|v|rope_k|cache_k|cache_v)$/.test(body.name);
        $("view-name").textContent = `${body.layer !== undefined ? `layers.${body.layer}.` : ""}${body.name}` +
          `${body.head !== undefined ? ` · ${kv ? "key/value" : "query"} head ${body.head}` : ""}: not shown`;
        $("view-shape").textContent = "the greyed-out heatmap below is the previous view";
        $("heatmap-wrap").classList.add("stale");
        // Nothing below may go on describing the previous view as if it were this one.
        hideCell();
        cursor = null;
        clearReadout();
        $("rowsum-line").textContent = "";
        $("howto-text").replaceChildren(el("p", {}, "No view to read: see the message above."));
        updateEditButton();
      }
    });
  }

  // Colour maps: sequential (white -> ink blue) for weights and probabilities, diverging
  // (blue - white - red) for signed values and gradients.
  const SEQ = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  const DIV = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];
  function ramp(stops) {
    const lut = new Uint8ClampedArray(256 * 3);
    for (let i = 0; i < 256; i++) {
      const t = (i / 255) * (stops.length - 1), k = Math.min(Math.floor(t), stops.length - 2), f = t - k;
      for (let c = 0; c < 3; c++) lut[i * 3 + c] = stops[k][c] + (stops[k + 1][c] - stops[k][c]) * f;
    }
    return lut;
  }
  const LUT = {seq: ramp(SEQ), div: ramp(DIV)};
  const MASKED_RGB = [214, 210, 200];

  function scaleFor(r, data, mask) {
    const local = r.local;
    if (!r.grad && (local === "attn.softmax" || local === "probs" || local === "attn.mask")) {
      return {kind: "seq", lo: 0, hi: 1, note: "fixed scale 0 … 1"};
    }
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < data.length; i++) {
      if (mask && mask[i]) continue;
      const v = data[i];
      if (Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
    }
    if (lo === Infinity) { lo = 0; hi = 1; }
    if (lo >= 0 && !r.grad) return {kind: "seq", lo: 0, hi: hi || 1, note: "scale 0 … max"};
    const a = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    return {kind: "div", lo: -a, hi: a, note: "symmetric scale: white is 0"};
  }

  let geom = null;   // layout of the last drawing, for hover and tests

  function draw() {
    const t0 = performance.now();
    hideCell();
    const r = current, data = r.data, mask = r.mask;
    const [rows, cols] = r.shape;
    if (!geom || geom.rows !== rows || geom.cols !== cols) cursor = null;
    const canvas = $("heatmap");
    const wrap = $("heatmap-wrap");
    const W = Math.max(320, wrap.clientWidth - 2);
    const tokenCols = r.col_kind === "token";
    const isSoftmax = r.local === "attn.softmax" && !r.grad;
    const rowLabelW = 112, rightW = isSoftmax ? 78 : 12;
    const topH = tokenCols ? 74 : 34, bottomH = 24;
    const availW = W - rowLabelW - rightW;
    const maxH = Math.max(260, Math.min(640, window.innerHeight - 260));
    let cw, ch;
    if (tokenCols) {
      cw = Math.max(1, Math.min(40, Math.floor(availW / cols)));
      ch = Math.max(1, Math.min(cw, 40, Math.floor(maxH / rows)));
      if (rows === 1) ch = Math.max(ch, 28);
    } else {
      // At least one pixel per column, so the mouse can reach every one of 1,024 vocabulary ids
      // (a wider grid scrolls sideways in its frame).
      cw = Math.floor(Math.max(1, Math.min(40, availW / cols)));
      ch = Math.max(2, Math.min(26, Math.floor(maxH / rows)));
    }
    const gridW = cw * cols, gridH = ch * rows;
    const cssW = rowLabelW + gridW + rightW + 8, cssH = topH + gridH + bottomH;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * dpr); canvas.height = Math.round(cssH * dpr);
    canvas.style.width = cssW + "px"; canvas.style.height = cssH + "px";
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, cssW, cssH);

    // 1. The cells: one pixel per value, scaled up without smoothing.
    const sc = scaleFor(r, data, mask);
    const lut = LUT[sc.kind];
    const img = new ImageData(cols, rows);
    const span = sc.hi - sc.lo || 1;
    const px = img.data, scale = 255 / span;
    for (let i = 0, o = 0; i < rows * cols; i++, o += 4) {
      const v = data[i];
      px[o + 3] = 255;
      if (mask && mask[i]) { px[o] = MASKED_RGB[0]; px[o + 1] = MASKED_RGB[1]; px[o + 2] = MASKED_RGB[2]; continue; }
      if (!(v > -Infinity && v < Infinity)) continue;          // NaN or infinite: black
      let k = Math.round((v - sc.lo) * scale);
      k = (k < 0 ? 0 : k > 255 ? 255 : k) * 3;
      px[o] = lut[k]; px[o + 1] = lut[k + 1]; px[o + 2] = lut[k + 2];
    }
    const off = document.createElement("canvas");
    off.width = cols; off.height = rows;
    off.getContext("2d").putImageData(img, 0, 0);
    const x0 = rowLabelW, y0 = topH;
    g.imageSmoothingEnabled = false;
    g.drawImage(off, x0, y0, gridW, gridH);

    // 2. Masked cells: hatched, so that "forbidden" never looks like "small".
    if (mask && cw >= 3 && ch >= 3) {
      g.save();
      g.beginPath();
      for (let i = 0; i < rows; i++) {
        let j = 0;
        while (j < cols) {
          if (!mask[i * cols + j]) { j++; continue; }
          let e = j; while (e < cols && mask[i * cols + e]) e++;
          g.rect(x0 + j * cw, y0 + i * ch, (e - j) * cw, ch);
          j = e;
        }
      }
      g.clip();
      g.strokeStyle = "rgba(120, 112, 96, 0.55)"; g.lineWidth = 1;
      g.beginPath();
      for (let d = -gridH; d < gridW; d += 6) { g.moveTo(x0 + d, y0 + gridH); g.lineTo(x0 + d + gridH, y0); }
      g.stroke();
      g.restore();
    }
    // Cell borders when cells are large enough to read one by one.
    if (cw >= 14 && ch >= 14) {
      g.strokeStyle = "rgba(255,255,255,0.7)"; g.lineWidth = 1;
      g.beginPath();
      for (let j = 1; j < cols; j++) { g.moveTo(x0 + j * cw + 0.5, y0); g.lineTo(x0 + j * cw + 0.5, y0 + gridH); }
      for (let i = 1; i < rows; i++) { g.moveTo(x0, y0 + i * ch + 0.5); g.lineTo(x0 + gridW, y0 + i * ch + 0.5); }
      g.stroke();
    }
    g.strokeStyle = "#9a9485"; g.lineWidth = 1; g.strokeRect(x0 - 0.5, y0 - 0.5, gridW + 1, gridH + 1);

    // 3. KV cache: which keys were cached and which are new (decoding steps).
    const stepMode = r.step > 0 && (r.axes[0] === "m" || r.axes[1] === "m");
    if (stepMode && r.axes[1] === "m") {
      for (let j = 0; j < cols; j++) {
        g.fillStyle = j < r.start ? "#b9b3a4" : "#e8871e";
        g.fillRect(x0 + j * cw, y0 - 7, Math.max(cw - (cw > 3 ? 1 : 0), 1), 5);
      }
    }

    // 4. Labels: rows (left), columns (top), axis captions.
    g.fillStyle = "#2b2a27"; g.textBaseline = "middle";
    const fs = Math.max(9, Math.min(13, ch - 2));
    const rowStep = Math.max(1, Math.ceil(12 / ch));
    g.font = `${fs}px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace`;
    g.textAlign = "right";
    for (let i = 0; i < rows; i += rowStep) {
      const y = y0 + i * ch + ch / 2;
      let label;
      if (r.rows.length) {
        const p = clip(show(r.rows[i]), 9);
        label = ch >= 9 ? `${p} ${r.row_pos[i]}` : String(r.row_pos[i]);
      } else label = String(i);
      g.fillText(label, x0 - 6, y);
    }
    g.textAlign = "left";
    g.font = `11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace`;
    if (tokenCols) {
      const colStep = Math.max(1, Math.ceil(12 / cw));
      for (let j = 0; j < cols; j += colStep) {
        g.save();
        g.translate(x0 + j * cw + cw / 2 + 3, y0 - 10);
        g.rotate(-Math.PI / 3);
        g.fillText(cw >= 9 ? `${clip(show(r.cols[j]), 8)} ${j}` : String(j), 0, 0);
        g.restore();
      }
    } else if (r.col_kind !== "none") {
      const every = niceStep(cols, gridW);
      g.textAlign = "center";
      for (let j = 0; j < cols; j += every) g.fillText(String(j), x0 + j * cw + cw / 2, y0 - 9);
    }
    g.font = "600 12px system-ui, sans-serif"; g.fillStyle = "#6b5f45";
    const rowName = r.axes[0] === "n" && !tokenCols ? "position" : (AXIS_NAMES[r.axes[0]] || r.axes[0]);
    const colName = AXIS_NAMES[r.axes[1]] ?? r.axes[1];
    g.textAlign = "left";
    const rowCaption = tokenCols ? "query ↓" : `${rowName} ↓`;
    g.fillText(rowCaption, 4, 12);
    if (colName) {
      g.textAlign = "right";
      g.fillText(tokenCols ? "key →" : `${colName} →`, x0 + gridW, cssH - 9);
    }

    // 5. Row sums of the attention weights.
    const sums = [];
    if (isSoftmax) {
      for (let i = 0; i < rows; i++) {
        let s = 0;
        for (let j = 0; j < cols; j++) s += data[i * cols + j];
        sums.push(s);
      }
      g.textAlign = "left"; g.fillStyle = "#6b5f45"; g.font = "600 12px system-ui, sans-serif";
      g.fillText("Σ row", x0 + gridW + 10, y0 - 10);
      g.font = `${Math.min(11, fs)}px ui-monospace, monospace`; g.fillStyle = "#2b2a27";
      for (let i = 0; i < rows; i += rowStep) g.fillText(sums[i].toFixed(6), x0 + gridW + 10, y0 + i * ch + ch / 2);
      let worst = 0;
      for (const s of sums) worst = Math.max(worst, Math.abs(s - 1));
      // float32 rounding leaves |Σ row − 1| near 1e-7; far more means the weights were set by hand (an edit).
      $("rowsum-line").textContent = worst < 1e-4
        ? `Every row sums to 1 up to rounding: the largest |Σ row − 1| is ${worst.toExponential(2)}.`
        : `Not every row sums to 1: the largest |Σ row − 1| is ${worst.toExponential(2)}, because an ` +
          "intervention set these weights after the softmax.";
    } else $("rowsum-line").textContent = "";

    geom = {x0, y0, cw, ch, rows, cols};
    // A cell picked before is read again in this view; otherwise the line must not keep describing a cell
    // of the previous view (it is a live region: a screen reader would announce a number that is not here).
    if (cursor) showReadout(cursor.i, cursor.j);
    else clearReadout();
    updateEditButton();
    glass.heatmap = {
      name: r.name, local: r.local, layer: r.layer, head: r.head, grad: r.grad, step: r.step,
      rows, cols, n: r.n, m: r.m, start: r.start, axes: r.axes, values: data, masked: mask,
      rowLabels: r.rows, colLabels: r.cols, rowSums: sums, scale: sc,
      value: (i, j) => data[i * cols + j],
      // The centre of cell (i, j) in CSS pixels from the canvas's top-left corner, for hovering.
      cellCenter: (i, j) => ({x: x0 + (j + 0.5) * cw, y: y0 + (i + 0.5) * ch}),
    };
    canvas.dataset.rows = String(rows); canvas.dataset.cols = String(cols);
    canvas.dataset.n = String(r.n); canvas.dataset.m = String(r.m); canvas.dataset.name = r.name;

    drawLegend(sc, r, mask);
    describeView(r, sc);
    state.rendered++;
    glass.lastRenderMs = performance.now() - t0;
  }

  function niceStep(cols, width) {
    const target = Math.max(1, Math.ceil(cols / Math.max(1, width / 48)));
    for (const s of [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]) if (s >= target) return s;
    return 1024;
  }

  function drawLegend(sc, r, mask) {
    const c = $("legend-bar"), g = c.getContext("2d");
    const lut = LUT[sc.kind];
    for (let x = 0; x < c.width; x++) {
      const k = Math.round((x / (c.width - 1)) * 255) * 3;
      g.fillStyle = `rgb(${lut[k]},${lut[k + 1]},${lut[k + 2]})`;
      g.fillRect(x, 0, 1, c.height);
    }
    $("legend-lo").textContent = fmt(sc.lo);
    $("legend-hi").textContent = fmt(sc.hi) + "  (" + sc.note + ")";
    $("legend-masked").hidden = !mask || !mask.some((v) => v);
    $("legend-cache").hidden = !(r.step > 0 && r.axes[1] === "m");
  }

  function describeView(r, sc) {
    const c = info.model;
    const headTxt = r.head_axis ? ` · ${r.head_axis === "H" ? "query" : "key/value"} head ${r.head}` : "";
    const what = r.grad ? `∂ loss / ∂ ${r.name}` : r.name;
    $("view-name").textContent = what + headTxt;
    const iv = state.intervention && !r.step ? ` · with intervention: ${ivText(state.intervention)}` : "";
    const stepTxt = r.step ? `decoding step ${r.step}: n = ${r.n} new query, m = ${r.m} keys (${r.start} cached + ${r.n} new)`
      : `prompt pass: n = ${r.n} queries, m = ${r.m} keys`;
    const shape = `shape (${r.axes.filter((a) => a).map((a, i) => `${a} = ${r.shape[i]}`).join(", ")})`;
    const target = r.grad ? ` · loss = −log p(${JSON.stringify(r.target_piece)}) at the last position` : "";
    $("view-shape").textContent = `${shape} · ${stepTxt}${target}${iv}`;
    $("howto-text").replaceChildren(...howTo(r, c, sc).map((t) => el("p", {}, t)));
  }

  function howTo(r, c, sc) {
    const out = [];
    if (r.grad) {
      out.push("This is a gradient, not an activation: each cell says how much the loss −log p(target) would change " +
        "per unit change of that number, holding everything else fixed. Red raises the loss, blue lowers it. " +
        "A large gradient marks sensitivity, not importance: a number can be sensitive and still never change.");
    }
    if (r.axes[1] === "m") {
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
        ? "Each row is a distribution over all ids and sums to 1; the colour scale runs from 0 to the largest value."
        : "Logits are unnormalised: only their differences within a row matter (the softmax ignores a shift).");
    } else if (r.col_kind === "none" || r.shape[1] === 1) {
      out.push("One number per position (a single column): rows are positions, one per token. Hover a cell, or " +
        "move to it with the arrow keys, for its exact value.");
    } else {
      out.push(`Rows are positions (one per token), columns are the coordinates of the vector at that position. ` +
        "A feature index has no meaning by itself: there is no reason feature 17 should mean anything a person could name.");
      if (!r.grad) out.push(sc && sc.kind === "seq"
        ? "The colour scale runs from 0 to the largest value (every value here is >= 0); hover a cell, or move to it with the arrow keys, for its exact value."
        : "The colour scale is symmetric around 0 for signed values; hover a cell, or move to it with the arrow keys, for its exact value.");
    }
    return out;
  }

  // The cell last shown, {i, j}: where the arrow keys move from. Forgotten when the view changes shape.
  let cursor = null;

  function hideCell() {
    $("tooltip").hidden = true;
    $("cell-outline").hidden = true;
  }

  // The cell under the mouse, or null.
  function cellAt(ev) {
    if (!geom || !current) return null;
    const b = $("heatmap").getBoundingClientRect();
    const j = Math.floor((ev.clientX - b.left - geom.x0) / geom.cw), i = Math.floor((ev.clientY - b.top - geom.y0) / geom.ch);
    return i < 0 || j < 0 || i >= geom.rows || j >= geom.cols ? null : {i, j};
  }

  // Hovering shows a cell's value; it does not pick the cell (the mouse crosses many on its way to a button).
  function onHover(ev) {
    const at = cellAt(ev);
    if (!at) { hideCell(); return; }
    showCell(at.i, at.j, ev.clientX, ev.clientY, false);
  }

  function onCellClick(ev) {
    const at = cellAt(ev);
    if (at) showCell(at.i, at.j, ev.clientX, ev.clientY, true);
  }

  // With the heatmap focused: arrows move one cell, Home / End go to the row's first / last cell,
  // Page Up / Page Down to the column's first / last; Escape hides the value. The first key shows cell (0, 0).
  function onCellKey(ev) {
    if (!geom || !current) return;
    if (ev.key === "Escape") { hideCell(); return; }
    if ((ev.key === "e" || ev.key === "E") && cursor) { ev.preventDefault(); editCell(); return; }
    const last = {i: geom.rows - 1, j: geom.cols - 1};
    const at = cursor || {i: 0, j: 0};
    const moves = {
      ArrowRight: {i: at.i, j: at.j + 1}, ArrowLeft: {i: at.i, j: at.j - 1},
      ArrowDown: {i: at.i + 1, j: at.j}, ArrowUp: {i: at.i - 1, j: at.j},
      Home: {i: at.i, j: 0}, End: {i: at.i, j: last.j}, PageUp: {i: 0, j: at.j}, PageDown: {i: last.i, j: at.j},
    };
    let to = moves[ev.key];
    if (!to) return;
    ev.preventDefault();
    if (!cursor) to = at;                                                 // the first key lands on (0, 0)
    const i = Math.min(Math.max(to.i, 0), last.i), j = Math.min(Math.max(to.j, 0), last.j);
    const b = $("heatmap").getBoundingClientRect();
    const centre = glass.heatmap.cellCenter(i, j);
    showCell(i, j, b.left + centre.x, b.top + centre.y, true);
    // A wide grid scrolls sideways in its frame: keep the cell in sight.
    const wrap = $("heatmap-wrap"), left = geom.x0 + j * geom.cw;
    if (left < wrap.scrollLeft || left + geom.cw > wrap.scrollLeft + wrap.clientWidth) {
      wrap.scrollLeft = Math.max(0, left - wrap.clientWidth / 2);
      showCell(i, j, $("heatmap").getBoundingClientRect().left + centre.x, b.top + centre.y, true);
    }
  }

  // Cell (i, j) of the current view in words: {where, exact, masked}.
  function describeCell(i, j) {
    const r = current;
    const masked = r.mask ? !!r.mask[i * geom.cols + j] : false;
    const rowTxt = r.rows.length ? `${r.axes[0] === "m" ? "key" : (r.col_kind === "token" ? "query" : "position")} ` +
      `${r.row_pos[i]} ${JSON.stringify(r.rows[i])}` : `row ${i}`;
    let colTxt;
    if (r.col_kind === "token") colTxt = `key ${j} ${JSON.stringify(r.cols[j])}`;
    else if (r.col_kind === "vocab") colTxt = `id ${j} "${info.vocab[j]}"`;
    else if (r.col_kind === "none") colTxt = "";
    else colTxt = `${r.axes[1]} ${j}`;
    return {where: colTxt ? `${rowTxt} → ${colTxt}` : rowTxt, exact: String(r.data[i * geom.cols + j]), masked};
  }

  const readoutHint = $("readout").textContent;   // the page's own words for "nothing read yet"

  function clearReadout() {
    const ro = $("readout");
    ro.textContent = readoutHint;
    delete ro.dataset.row; delete ro.dataset.col; delete ro.dataset.value;
  }

  function showReadout(i, j) {
    const c = describeCell(i, j), ro = $("readout");
    ro.textContent = `${c.where}: ${c.exact}${c.masked ? " (masked)" : ""}`;
    ro.dataset.row = String(i); ro.dataset.col = String(j); ro.dataset.value = c.exact;
  }

  // Show cell (i, j)'s exact value: tooltip next to the viewport point (cx, cy), outline, and the readout line
  // (a live region, so a screen reader announces it). ``pick``: the arrow keys or a click chose this cell
  // (the one "Edit cell" sets); hovering only shows it.
  function showCell(i, j, cx, cy, pick) {
    if (pick) cursor = {i, j};
    const {where, exact, masked} = describeCell(i, j);
    const tip = $("tooltip");
    tip.replaceChildren(
      el("div", {class: "small muted"}, where),
      el("div", {class: "mono big"}, exact),
    );
    if (masked) tip.append(el("div", {class: "small"}, "masked: this key is in the query's future"));
    tip.dataset.row = String(i); tip.dataset.col = String(j); tip.dataset.value = exact;
    tip.hidden = false;
    // Document coordinates: the tooltip stays by its cell when the page scrolls.
    let tx = cx + window.scrollX + 16, ty = cy + window.scrollY + 16;
    if (cx + 306 > window.innerWidth) tx = cx + window.scrollX - 300;
    if (cy + 106 > window.innerHeight) ty = cy + window.scrollY - 96;
    tip.style.left = tx + "px"; tip.style.top = ty + "px";
    const box = $("cell-outline"), c = $("heatmap");
    box.style.left = c.offsetLeft + geom.x0 + j * geom.cw - 1 + "px";
    box.style.top = c.offsetTop + geom.y0 + i * geom.ch - 1 + "px";
    box.style.width = geom.cw + 2 + "px"; box.style.height = geom.ch + 2 + "px";
    box.hidden = false;
    showReadout(i, j);
    updateEditButton();
  }

  // ------------------------------------------------------------------ editing one number
  // The cell being edited: {name, layer, head, row, col, was}, fixed when "Edit this cell" is pressed.
  let editing = null;
  const pickHint = $("iv-cell").textContent;   // the page's own words for "no cell picked yet"

  // Numbers inside the blocks, of the prompt's pass, can be set (not gradients, not the boolean mask).
  // Offline, no new forward pass can run: only the live inspector edits.
  function editable(r) {
    return !embedded && !!r && !r.grad && !r.step && r.layer !== null && r.layer !== undefined &&
      r.local !== "attn.mask";
  }

  // The button names the picked cell, and is off when that cell cannot be set: a gradient, a decoding
  // step, the mask, a view that failed to load, or a future key of the scores or weights (masked by rule).
  function updateEditButton() {
    const b = $("edit-cell"), r = current;
    const stale = $("heatmap-wrap").classList.contains("stale");
    const masked = !!cursor && !!r && !!r.mask && !!r.mask[cursor.i * geom.cols + cursor.j];
    // A future key of the scores or weights is masked by rule in the pass an edit runs on, even when the
    // view shows it unmasked under "switch off the causal mask" (an edit replaces that intervention).
    const future = !!cursor && !!r && (r.local === "attn.scores" || r.local === "attn.softmax") &&
      cursor.j > (r.start || 0) + cursor.i;
    b.disabled = !cursor || !editable(r) || stale || masked || future;
    b.textContent = cursor ? `Edit cell (${cursor.i}, ${cursor.j})` : "Edit this cell";
    b.title = future && !masked ? "a future key: masked in the pass an edit runs on (the edit would replace " +
      "the mask switch)" : "set the picked number in the prompt's pass (Intervene); key: E";
  }

  async function editCell() {
    const r = current;
    if (!cursor || $("edit-cell").disabled) return;
    const {i, j} = cursor;
    let was = r.data[i * geom.cols + j];
    if (state.intervention) {
      // The view shows the numbers under the current intervention; the edit replaces it, so ask for the plain one.
      const body = snapshotBody();
      delete body.intervention;
      try {
        const plain = await ask("snapshot", body);
        was = decode(plain.values)[i * plain.shape[1] + j];
      } catch (e) { /* keep the shown number */ }
    }
    editing = {name: r.local, layer: r.layer, head: r.head_axis ? r.head : null, row: i, col: j, was};
    document.querySelector("input[name=iv][value=edit]").checked = true;
    $("iv-value").value = String(was);
    await onIntervention();   // applied at once (to the number it had: nothing moves yet), so page and panel agree
    $("iv-value").focus();
    $("iv-value").select();
  }

  // ------------------------------------------------------------------ next token
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

  function nextBody() {
    const body = {prompt: state.prompt};
    if (state.step) body.step = state.step;
    if (state.intervention && !state.step) body.intervention = state.intervention;
    return body;
  }

  async function loadNext() {
    if (!state.prompt) return;
    await busy(async () => {
      const body = nextBody();
      try {
        const r = await ask("next", body);
        if (requestKey("next", nextBody()) !== requestKey("next", body)) return;   // superseded
        nextData = {raw: r, logits: Float64Array.from(decode(r.logits)),
                    after: r.after ? Float64Array.from(decode(r.after.logits)) : null};
        state.finished = r.finished;
        const gen = state.ids.length;
        drawTokens(r.tokens, gen);
        const where = r.step ? `after step ${r.step} (fed "${r.fed.piece}" at position ${r.position})`
          : `after the prompt's last token "${r.tokens[r.position]}" (position ${r.position})`;
        // The bars are the model's own distribution; an intervention's effect is shown below, before and after.
        $("next-where").textContent = where + (r.after ? " · without the intervention (its effect: Intervene, below)" : "");
        drawNext();
        drawStepLine(r);
      } catch (e) {
        $("next-where").textContent = e.message;
        if (nextData) nextData.after = null;          // no stale before/after under a refused intervention
        $("iv-bars").replaceChildren();
        $("iv-summary").textContent = state.intervention ? `Not applied: ${e.message}` : "";
      }
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

  function onSampling() { readSampling(); if (nextData) drawNext(); }

  function drawNext() {
    const t0 = performance.now();
    readSampling();
    const z = nextData.logits;
    const probs = tempered(z, state.temperature);
    const {sampled, survivors} = filtered(z, probs, state.topK, state.topP);
    glass.next = {logits: z, probs, sampled, survivors, temperature: state.temperature, topK: state.topK,
                  topP: state.topP, step: state.step};
    const bars = $("bars");
    bars.replaceChildren();
    const top = ranked(probs, 12, z);
    const keep = new Set(survivors);
    const pmax = probs[top[0]] || 1;
    for (const id of top) {
      const li = el("li", {class: "bar" + (keep.has(id) ? " kept" : " cut"), "data-id": String(id),
                           "data-prob": String(probs[id]), "data-sampled": String(sampled[id])});
      li.title = `id ${id}: logit ${z[id]}; p = ${probs[id]}` + (keep.has(id) ? "" : " (filtered out)");
      const fill = el("span", {class: "fill"});
      fill.style.width = (100 * probs[id] / pmax).toFixed(2) + "%";
      li.append(el("span", {class: "tick"}, keep.has(id) ? "✓" : "·"),
                el("span", {class: "piece mono"}, clip(show(info.vocab[id]), 14)),
                el("span", {class: "track"}, ""),
                el("span", {class: "p mono"}, fmt(probs[id])),
                el("span", {class: "q mono muted"}, keep.has(id) ? fmt(sampled[id]) : "—"));
      li.querySelector(".track").append(fill);
      if (state.mode === "server" && !state.step) {
        li.classList.add("clickable");
        // The gradient of a candidate's loss; from a view that has none (probs, the mask), the nearest that does.
        const pick = () => {
          state.target = id;
          userSelect(state.name === "probs" ? {name: "logits", grad: true}
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
    drawIntervention();
    glass.lastNextMs = performance.now() - t0;
  }

  function toggleAll() {
    const w = $("all-wrap");
    w.hidden = !w.hidden;
    $("show-all").textContent = w.hidden ? `show the full ${nice(info.model.vocab_size)}-way distribution`
      : "hide the full distribution";
    if (!w.hidden) drawAll();
  }

  function drawAll() {
    const c = $("all-canvas"), wrap = $("all-wrap");
    const probs = glass.next.probs, V = probs.length;
    const order = ranked(probs, V, glass.next.logits);
    const W = Math.max(200, wrap.clientWidth), H = 120, dpr = window.devicePixelRatio || 1;
    c.width = W * dpr; c.height = H * dpr; c.style.width = W + "px"; c.style.height = H + "px";
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.fillStyle = "#fbfaf6"; g.fillRect(0, 0, W, H);
    const lo = -12;  // log10 floor
    const keep = new Set(glass.next.survivors);
    for (let r = 0; r < V; r++) {
      const p = probs[order[r]];
      const h = p > 0 ? Math.max(1, ((Math.log10(p) - lo) / -lo) * (H - 14)) : 0;
      g.fillStyle = keep.has(order[r]) ? "#2171b5" : "#c9c3b3";
      g.fillRect((r / V) * W, H - h, Math.max(1, W / V), h);
    }
    g.fillStyle = "#6b5f45"; g.font = "11px system-ui"; g.fillText("1", 2, 10); g.fillText("1e-12", 2, H - 3);
    c.onmousemove = (ev) => {
      const r = Math.min(V - 1, Math.max(0, Math.floor(((ev.clientX - c.getBoundingClientRect().left) / W) * V)));
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

  // ------------------------------------------------------------------ generation
  function drawStepLine(r) {
    const line = $("step-line");
    if (!r.step) line.textContent = `step 0: the prompt, n = ${r.m} queries, m = ${r.m} keys, nothing cached yet`;
    else line.textContent = `step ${r.step}: fed "${r.fed.piece}" · n = 1 · m = ${r.m} ` +
      `(${r.m - 1} cached + 1 new)`;
    if (r.finished) line.textContent += ` · ${r.finished}`;
    if (!r.finished && !nextStepSaved(r.step)) line.textContent += " · the last step saved in this offline page";
    $("step").disabled = !canStep(r.step, r.finished);
    line.dataset.step = String(r.step); line.dataset.m = String(r.m);
  }

  // Offline, a step exists only if the export saved it; live, until the text ends.
  function nextStepSaved(step) {
    return !embedded || !!embedded.responses[requestKey("next", {prompt: state.prompt, step: step + 1})];
  }
  function canStep(step, finished) { return !finished && nextStepSaved(step); }

  let stepping = false;
  async function doStep() {
    if (!state.prompt || state.finished || stepping) return;      // one step at a time
    stepping = true;
    $("step").disabled = true;
    const before = state.step;
    state.step += 1;
    if (state.grad) state.grad = false;
    syncControls();
    try {
      await Promise.all([loadNext(), loadView()]);
    } finally {
      stepping = false;
    }
    if (Number($("step-line").dataset.step) !== state.step) {      // the step did not load: stay where we were
      state.step = before;
      syncControls();
      $("step").disabled = !canStep(state.step, state.finished);
    }
  }

  async function resetSteps() {
    state.step = 0;
    syncControls();
    await Promise.all([loadNext(), loadView()]);
  }

  // ------------------------------------------------------------------ interventions
  function ivText(iv) {
    if (iv.kind === "ablate") return `head ${iv.head} of layer ${iv.layer} ablated (its mix zeroed)`;
    if (iv.kind === "mask_off") return `causal mask switched off in layer ${iv.layer}`;
    if (iv.kind === "edit") return `${cellText(iv)} set to ${iv.value}`;
    return `scores of layer ${iv.layer} divided by T = ${iv.temperature}`;
  }

  function cellText(c) {
    const head = c.head !== null && c.head !== undefined ? `, head ${c.head}` : "";
    return `layers.${c.layer}.${c.name}${head}, cell (${c.row}, ${c.col})`;
  }

  function readIntervention() {
    const kind = document.querySelector("input[name=iv]:checked").value;
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

  function setIntervention(iv) {
    const kind = iv ? iv.kind : "none";
    document.querySelector(`input[name=iv][value=${kind}]`).checked = true;
    if (iv && iv.kind === "edit") {
      const same = editing && editing.name === iv.name && editing.layer === iv.layer &&
        editing.head === (iv.head ?? null) && editing.row === iv.row && editing.col === iv.col;
      editing = {name: iv.name, layer: iv.layer, head: iv.head ?? null, row: iv.row, col: iv.col,
                 was: same ? editing.was : "?"};
      $("iv-value").value = String(iv.value);
    } else if (iv) {
      $("iv-layer").value = String(iv.layer);
      if (iv.head !== undefined && iv.head !== null) $("iv-head").value = String(iv.head);
      if (iv.temperature !== undefined && iv.temperature !== null) $("iv-temp").value = String(iv.temperature);
    }
    state.intervention = readIntervention();
  }

  async function onIntervention() {
    state.intervention = readIntervention();
    const note = $("iv-reset-note");
    note.hidden = true;
    if (state.step && state.intervention) {
      // An intervention changes the prompt's pass, so the generated steps are gone: say so, not silently.
      note.textContent = `Back at the prompt: the ${state.step} generated step${state.step === 1 ? "" : "s"} ` +
        "came from the pass without this intervention.";
      note.hidden = false;
      await resetSteps();
    }
    await Promise.all([loadNext(), loadView()]);
  }

  function drawIntervention() {
    const box = $("iv-bars"), sum = $("iv-summary");
    box.replaceChildren();
    readIntervention();
    if (!state.intervention || !nextData || !nextData.after) {
      glass.next.before = null; glass.next.after = null;
      sum.textContent = state.step && state.intervention ? "Interventions change the prompt's pass: go back to the prompt." : "";
      return;
    }
    const before = glass.next.probs, after = tempered(nextData.after, state.temperature);
    glass.next.before = before; glass.next.after = after;
    let kl = 0, maxd = 0;
    for (let i = 0; i < before.length; i++) {
      if (before[i] > 0) kl += after[i] > 0 ? before[i] * (Math.log(before[i]) - Math.log(after[i])) : Infinity;
      maxd = Math.max(maxd, Math.abs(before[i] - after[i]));
    }
    const tb = ranked(before, 1)[0], ta = ranked(after, 1)[0];
    sum.textContent = `${ivText(state.intervention)}. Top choice "${info.vocab[tb]}" → ` +
      `"${info.vocab[ta]}"; largest change of a probability ${fmt(maxd)}; KL(before ‖ after) = ` +
      (Number.isFinite(kl) ? `${fmt(kl)} nats.` : "∞ (the intervention gives 0 to a token that had mass).");
    sum.dataset.kl = String(kl); sum.dataset.maxdiff = String(maxd);
    const ids = [...new Set([...ranked(before, 6), ...ranked(after, 6)])];
    const pmax = Math.max(...ids.map((i) => Math.max(before[i], after[i]))) || 1;
    box.append(el("li", {class: "bar head small muted"}, "candidate · before (grey) / after (orange)"));
    for (const id of ids) {
      const li = el("li", {class: "bar", "data-id": String(id), "data-before": String(before[id]),
                           "data-after": String(after[id])});
      const track = el("span", {class: "track two"});
      const b = el("span", {class: "fill before"}), a = el("span", {class: "fill after"});
      b.style.width = (100 * before[id] / pmax).toFixed(2) + "%";
      a.style.width = (100 * after[id] / pmax).toFixed(2) + "%";
      track.append(b, a);
      li.append(el("span", {class: "tick"}, ""), el("span", {class: "piece mono"}, clip(show(info.vocab[id]), 14)), track,
                el("span", {class: "p mono"}, fmt(before[id])), el("span", {class: "q mono"}, fmt(after[id])));
      box.append(li);
    }
  }

  // ------------------------------------------------------------------ start
  async function start() {
    try {
      info = await source.info();
    } catch (e) {
      $("model-line").textContent = "cannot reach the inspector's server: " + e.message;
      return;
    }
    buildControls();
    readIntervention();
    const boot = embedded ? embedded.prompt : (info.prompt || "Once upon a time there was a little dog");
    $("prompt").value = boot;
    if (embedded) {
      $("prompt").readOnly = true;
      $("run").disabled = true;
    }
    state.layer = 0; state.name = "attn.softmax"; state.head = 0;
    syncControls();
    await runPrompt();
    glass.ready = true;
    document.body.dataset.ready = "1";
  }
  glass.started = start();
})();
