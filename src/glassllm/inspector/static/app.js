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
  // The colour maps and the hatching of masked cells, defined once in Python (glassllm.trace.colors,
  // which Trace.plot uses too); the server and the export put them in the page as <script id="glass-colors">.
  const COLORS = JSON.parse(document.getElementById("glass-colors").textContent);

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

  // In a notebook widget (glassllm.show(..., live=True)) the page sits in a frame and the kernel answers:
  // each request goes to the frame's parent as a message, and its answer comes back the same way.
  function kernelSource() {
    let last = 0;
    const waiting = new Map();
    window.addEventListener("message", (ev) => {
      const m = ev.data;
      if (ev.source !== window.parent || !m || m.glass !== "answer" || !waiting.has(m.id)) return;
      const {resolve, reject} = waiting.get(m.id);
      waiting.delete(m.id);
      if (m.error) reject(new Error(m.error)); else resolve(m.answer);
    });
    const call = (kind, body) => new Promise((resolve, reject) => {
      const id = ++last;
      waiting.set(id, {resolve, reject});
      window.parent.postMessage({glass: "ask", id, kind, body: body || null}, "*");
    });
    return {mode: "server", kernel: true, info: () => call("info", null), get: call};
  }

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
      if (!r) throw new Error("not included in this offline export" + (embedded.left_out ? " (" + embedded.left_out + ")" : "") +
        (body.intervention ? " (under an intervention " +
        "it holds the intervened layer's attention, and under a layer-0 head's ablation every later layer's)" : "") +
        ": run `glassllm inspect` for every view");
      if (r.error) throw new Error(r.error);
      return r;
    },
  } : document.getElementById("glass-kernel") ? kernelSource() : {
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
    if (enc.dtype === "float16") return halves(new Uint16Array(bytes.buffer));
    return bytes;
  }

  // IEEE half-precision bits -> Float32Array (the training timeline stores its weights so).
  function halves(u16) {
    const out = new Float32Array(u16.length);
    for (let i = 0; i < u16.length; i++) {
      const h = u16[i], sign = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
      out[i] = e === 0 ? sign * f * 2 ** -24 : e === 31 ? (f ? NaN : sign * Infinity) : sign * (1 + f / 1024) * 2 ** (e - 15);
    }
    return out;
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
  // A number at the precision of the dtype it was computed in: float32 values are shown with the fewest
  // digits that read back as the same float32 (at most 9), float64 ones with JavaScript's shortest (at most 17).
  function precise(v, dtype) {
    if (dtype !== "float32" || !Number.isFinite(v)) return String(v);
    for (let p = 1; p < 9; p++) {
      const s = v.toPrecision(p);
      if (Math.fround(Number(s)) === v) return String(Number(s));
    }
    return String(Number(v.toPrecision(9)));
  }
  const AXIS_NAMES = {
    n: "query position", m: "key position", C: "feature (C)", D: "head feature (D)", F: "MLP unit (F)",
    V: "vocabulary id (V)", "": "",
  };

  // ------------------------------------------------------------------ state
  const state = {
    mode: source.mode, prompt: "", ids: [], pieces: [], layer: 0, name: "attn.softmax", head: 0, grad: false,
    step: 0, temperature: 1, topK: null, topP: null, intervention: null, target: null, error: null, query: null,
    busy: 0, rendered: 0, tab: "heatmap",
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
    state, requestKey, timings: [], colors: COLORS,
    heatmap: null, next: null, lens: null, attribution: null,
    // Select layer / snapshot / head / gradient, like the page's controls; resolves once drawn.
    async select(sel) { Object.assign(state, normalizeSelection(sel)); syncControls(); await loadView(); },
    async run(prompt) { $("prompt").value = prompt; await runPrompt(); },
    async setTemperature(T) { $("temperature").value = String(T); onSampling(); },
    async step() { await doStep(); },
    async reset() { await resetSteps(); },
    async intervene(iv) { setIntervention(iv); await onIntervention(); },
    idle() { return idlePromise(); },
    tab(name) { return showTab(name); },
    walkTo(index) { return walkTo(index); },
    save(kind, format) { return saveView(kind, format); },
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
  // The header's second line: where the numbers come from, and which path (kernel or reference) the layers took.
  function drawModeLine(paths) {
    const line = $("mode-line");                        // one line: the full text is its tooltip
    line.textContent = (state.mode === "export" ? "offline export: one prompt, precomputed"
      : source.kernel ? "live: this notebook's kernel" : "live: local server") + (paths ? ` · ${paths}` : "");
    line.title = line.textContent;
  }

  const plural = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`;

  function buildControls() {
    const c = info.model, given = info.source;   // given: attention weights passed in as arrays, no model
    $("model-line").textContent = given ? `attention weights given as arrays: ${plural(given.layers, "layer")} · ` +
      `${plural(given.heads, "head")} · ${plural(given.tokens, "token")}` :
      `${plural(c.n_layers, "layer")} · width C = ${c.dim} · ${plural(c.n_heads, "query head")} sharing ` +
      `${plural(c.n_kv_heads, "key/value head")} ` +
      `of size D = ${c.head_dim} · MLP F = ${c.ffn_dim} · vocabulary V = ${nice(c.vocab_size)} · ` +
      `context ${c.max_seq_len} · ${nice(c.params)} parameters (${c.dtype})` +
      (info.meta.step ? ` · trained ${nice(Number(info.meta.step))} steps` : "") +
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
    const select = $("snapshot");
    select.replaceChildren();
    const groups = new Map();
    // A notebook view holds only some snapshots (info.offline): it lists those and says how to include more.
    const held = info.offline ? new Set(info.offline.held) : null;
    for (const n of info.names) {
      names[n.name] = n;
      n.held = !held || held.has(n.name);
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
    const off = info.offline;
    if (off) {
      const missing = info.names.length - off.held.length;
      $("offline-note").hidden = !missing;
      $("offline-note").textContent = missing
        ? `This notebook view holds ${off.held.length} of the ${info.names.length} snapshots; ${off.more_names}.` : "";
      if (!off.interventions) {
        document.querySelectorAll("input[name=iv]").forEach((r) => { if (r.value !== "none") r.disabled = true; });
        $("iv-note").textContent = `This notebook view holds no interventions: ${off.more_interventions}.`;
        $("iv-note").dataset.fixed = "1";
      }
    }

    $("topk").max = String(Math.min(100, c.vocab_size));
    for (const id of ["temperature", "topk", "topp"]) $(id).addEventListener("input", onSampling);
    $("show-all").addEventListener("click", toggleAll);
    $("explain-map").addEventListener("click", () => showTab("map"));
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
    // Redraw when the heatmap's frame changes width (the layout depends on it), not on every height change:
    // the window's width, or a notebook's output frame that gets its width only after the first draw.
    new ResizeObserver(() => {
      const w = $("heatmap-wrap").clientWidth;
      if (current && w > 0 && state.tab === "heatmap" && (!glass.heatmap || w !== glass.heatmap.wrapWidth)) draw();
    }).observe($("heatmap-wrap"));
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
    if (state.tab === "map") updateMap();
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
      await Promise.all([loadView(), loadNext(), loadLens(), loadAttribution()]);
    });
  }

  // ------------------------------------------------------------------ logit lens and direct attribution
  // Both describe the prompt's own pass (no intervention, no decoding step): glassllm.trace.lens_top and
  // glassllm.trace.direct_attribution answer them. glass.lens and glass.attribution hold what is shown.
  const LENS_COLUMNS = 12;

  // One of the prompt's whole-pass views: asked for, kept in glass[kind], drawn into #box by `draw`;
  // if it cannot be had, the box is emptied and #errorLine says why.
  async function loadPanel(kind, box, errorLine, draw) {
    const err = $(errorLine), target = $(box);
    try {
      const r = await ask(kind, {prompt: state.prompt});
      glass[kind] = r;
      err.hidden = true;
      draw(r, target);
    } catch (e) {
      glass[kind] = null;
      target.replaceChildren();
      err.textContent = e.message;
      err.hidden = false;
    }
  }

  function loadLens() {
    return loadPanel("lens", "lens", "lens-error", (r, table) => {
      // The last LENS_COLUMNS positions only: a table cell per stream and position (the page stays small).
      const first = Math.max(0, r.pieces.length - LENS_COLUMNS);
      $("lens-note").textContent = first > 0 ? `positions ${first}–${r.pieces.length - 1} of ${r.pieces.length}` : "";
      const head = el("tr");
      head.append(el("th", {}, "stream ↓ · position →"));
      r.pieces.slice(first).forEach((p, j) => head.append(
        el("th", {title: `position ${first + j}`}, `${first + j} ${clip(show(p), 10)}`)));
      const rows = r.streams.map((name, s) => {
        const tr = el("tr");
        tr.append(el("th", {}, name));
        r.top_pieces[s].slice(first).forEach((piece, j) => {
          const i = first + j;
          const p = r.prob[s][i];
          const td = el("td", {title: `${name}, position ${i}: ${JSON.stringify(piece)} (id ${r.top[s][i]}), p = ${p}`});
          td.style.background = `rgba(44, 111, 187, ${(0.6 * p).toFixed(3)})`;
          td.append(document.createTextNode(clip(show(piece), 10)), el("small", {}, p.toFixed(2)));
          tr.append(td);
        });
        return tr;
      });
      table.replaceChildren(head, ...rows);
    });
  }

  function loadAttribution() {
    return loadPanel("attribution", "attr-bars", "attr-error", (r, list) => {
      $("attr-line").textContent = `Logit of ${JSON.stringify(r.piece)} (id ${r.token}) at position ${r.position}: `
        + `${fmt(r.total)}, split into what each part writes directly (the final norm's scale frozen).`;
      const top = Math.max(...r.values.map(Math.abs), 1e-12);
      list.replaceChildren(...r.labels.map((label, i) => {
        const v = r.values[i], w = (50 * Math.abs(v) / top).toFixed(2);
        const bar = el("span", {class: "bar " + (v >= 0 ? "pos" : "neg")});
        bar.style.width = w + "%";
        bar.style.left = v >= 0 ? "50%" : (50 - Number(w)) + "%";
        const track = el("span", {class: "track"});
        track.append(bar);
        const li = el("li", {"data-label": label});
        li.append(el("span", {class: "mono small"}, label), track, el("span", {class: "mono small"}, fmt(v, 3)));
        return li;
      }));
    });
  }

  function drawTokens(pieces, generatedFrom) {
    const box = $("tokens");
    box.replaceChildren();
    pieces.forEach((p, i) => {
      const chip = el("span", {class: "tok" + (i >= generatedFrom ? " gen" : ""), "data-pos": String(i)});
      chip.append(el("b", {}, show(p)), el("small", {}, String(i)));
      chip.title = `position ${i}${i >= generatedFrom ? " (generated)" : ""}: click to pick its query row and key column`;
      chip.classList.toggle("on", i === state.query);
      chip.tabIndex = 0;
      chip.setAttribute("role", "button");
      chip.setAttribute("aria-pressed", String(i === state.query));
      chip.addEventListener("click", () => selectPosition(i));
      chip.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); selectPosition(i); }
      });
      box.append(chip);
    });
  }

  // A token chip picks a position: its query row and its key column are outlined in the heatmap, and the
  // cell where they cross is read out (glass.heatmap.queryRow / queryCol).
  function selectPosition(pos) {
    state.query = state.query === pos ? null : pos;
    $("tokens").querySelectorAll(".tok").forEach((c) => {
      const on = Number(c.dataset.pos) === state.query;
      c.classList.toggle("on", on);
      c.setAttribute("aria-pressed", String(on));
    });
    if (state.tab === "walk" && state.query !== null) { $("walk-pos").value = String(state.query); walkTo(walk.index); }
    if (!current) return;
    draw();
    const {queryRow: i, queryCol: j} = glass.heatmap;
    if (i >= 0) { cursor = {i, j: Math.max(j, 0)}; showReadout(cursor.i, cursor.j); updateEditButton(); }
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
        await updateCompare(body);
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
        $("compare").hidden = true;
        glass.compare = null;
        updateEditButton();
      }
    });
    if (state.tab === "heads") await loadGrid();           // the grid follows value/gradient, prompt, intervention
  }

  // Colour maps: sequential (white -> ink blue) for weights and probabilities, diverging
  // (blue - white - red) for signed values and gradients, and the masked cells' ground and hatching.
  // Defined once in Python: COLORS, at the top.
  const SEQ = COLORS.sequential, DIV = COLORS.diverging;
  function ramp(stops) {
    const lut = new Uint8ClampedArray(256 * 3);
    for (let i = 0; i < 256; i++) {
      const t = (i / 255) * (stops.length - 1), k = Math.min(Math.floor(t), stops.length - 2), f = t - k;
      for (let c = 0; c < 3; c++) lut[i * 3 + c] = stops[k][c] + (stops[k + 1][c] - stops[k][c]) * f;
    }
    return lut;
  }
  const LUT = {seq: ramp(SEQ), div: ramp(DIV)};
  const MASKED_RGB = COLORS.masked;
  const HATCH_CSS = `rgba(${COLORS.hatch.rgb.join(", ")}, ${COLORS.hatch.alpha})`;

  function scaleFor(r, data, mask) {
    const local = r.local;
    if (!r.grad && (local === "attn.softmax" || local === "probs" || local === "attn.mask")) {
      return {kind: "seq", lo: 0, hi: 1, note: "fixed scale 0 … 1: white is 0, darkest blue is 1"};
    }
    let lo = Infinity, hi = -Infinity;
    for (let i = 0; i < data.length; i++) {
      if (mask && mask[i]) continue;
      const v = data[i];
      if (Number.isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
    }
    if (lo === Infinity) { lo = 0; hi = 1; }
    if (lo >= 0 && !r.grad) {
      return {kind: "seq", lo: 0, hi: hi || 1, note: "scale 0 … this view's largest value: white is 0, darkest blue the largest"};
    }
    const a = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    return {kind: "div", lo: -a, hi: a, note: "symmetric scale −a … a, a = this view's largest |value|: white is 0, " +
      "blue below, red above"};
  }

  let geom = null;   // layout of the last drawing, for hover and tests

  // A (rows, cols) matrix as an image of one pixel per value, in scale ``sc``'s colours; masked cells grey.
  function cellsImage(data, mask, rows, cols, sc) {
    const lut = LUT[sc.kind];
    const img = new ImageData(cols, rows);
    const px = img.data, scale = 255 / (sc.hi - sc.lo || 1);
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
    return off;
  }

  // Diagonal hatching over the masked cells of a grid drawn at (x0, y0) with cells cw x ch.
  function hatch(g, mask, rows, cols, x0, y0, cw, ch) {
    const gridW = cols * cw, gridH = rows * ch;
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
    g.strokeStyle = HATCH_CSS; g.lineWidth = 1;
    g.beginPath();
    for (let d = -gridH; d < gridW; d += COLORS.hatch.spacing) { g.moveTo(x0 + d, y0 + gridH); g.lineTo(x0 + d + gridH, y0); }
    g.stroke();
    g.restore();
  }

  // A matrix painted to fill ``canvas`` at cssW x cssH CSS pixels (thumbnails, before/after panels).
  function paint(canvas, data, rows, cols, mask, sc, cssW, cssH) {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(cssW * dpr); canvas.height = Math.round(cssH * dpr);
    canvas.style.width = cssW + "px"; canvas.style.height = cssH + "px";
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.imageSmoothingEnabled = cols > cssW;               // shrinking a wide matrix: average, do not drop columns
    g.drawImage(cellsImage(data, mask, rows, cols, sc), 0, 0, cssW, cssH);
    if (mask && mask.some((v) => v)) hatch(g, mask, rows, cols, 0, 0, cssW / cols, cssH / rows);
  }

  function draw() {
    const t0 = performance.now();
    hideCell();
    const r = current, data = r.data, mask = r.mask;
    const [rows, cols] = r.shape;
    if (!geom || geom.rows !== rows || geom.cols !== cols) cursor = null;
    const canvas = $("heatmap");
    const wrap = $("heatmap-wrap");
    const wrapW = wrap.clientWidth;                            // read once: reading it after a resize forces a layout
    const W = Math.max(320, wrapW - 2);
    const tokenCols = r.col_kind === "token";
    const isSoftmax = r.local === "attn.softmax" && !r.grad;
    const rowLabelW = 112, rightW = isSoftmax ? 78 : 12;
    const topH = tokenCols ? 74 : 34, bottomH = 24;
    const availW = W - rowLabelW - rightW;
    const top = canvas.getBoundingClientRect().top + window.scrollY;     // from the page's top
    const maxH = Math.max(200, Math.min(640, window.innerHeight - Math.min(top, 420) - 190));
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
    const x0 = rowLabelW, y0 = topH;
    g.imageSmoothingEnabled = false;
    g.drawImage(cellsImage(data, mask, rows, cols, sc), x0, y0, gridW, gridH);

    // 2. Masked cells: hatched, so that "forbidden" never looks like "small".
    if (mask && cw >= 3 && ch >= 3) hatch(g, mask, rows, cols, x0, y0, cw, ch);
    // Cell borders when cells are large enough to read one by one.
    if (cw >= 14 && ch >= 14) {
      g.strokeStyle = "rgba(255,255,255,0.7)"; g.lineWidth = 1;
      g.beginPath();
      for (let j = 1; j < cols; j++) { g.moveTo(x0 + j * cw + 0.5, y0); g.lineTo(x0 + j * cw + 0.5, y0 + gridH); }
      for (let i = 1; i < rows; i++) { g.moveTo(x0, y0 + i * ch + 0.5); g.lineTo(x0 + gridW, y0 + i * ch + 0.5); }
      g.stroke();
    }
    g.strokeStyle = "#9a9485"; g.lineWidth = 1; g.strokeRect(x0 - 0.5, y0 - 0.5, gridW + 1, gridH + 1);
    // The position picked with a token chip: its query row and, where columns are positions, its key column.
    const queryRow = state.query === null || !r.row_pos ? -1 : r.row_pos.indexOf(state.query);
    const queryCol = state.query !== null && tokenCols && state.query < cols ? state.query : -1;
    g.strokeStyle = "#e8871e"; g.lineWidth = 2;
    if (queryRow >= 0) g.strokeRect(x0 - 1, y0 + queryRow * ch - 1, gridW + 2, ch + 2);
    if (queryCol >= 0) g.strokeRect(x0 + queryCol * cw - 1, y0 - 1, cw + 2, gridH + 2);
    g.lineWidth = 1;

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

    // 6. The row labels again, on a strip that stays in place when a wide grid scrolls sideways.
    const strip = $("heatmap-rows"), wide = cssW > wrapW;
    strip.hidden = !wide;
    canvas.style.marginLeft = wide ? -x0 + "px" : "0";
    if (wide) {
      strip.width = Math.round(x0 * dpr); strip.height = canvas.height;
      strip.style.width = x0 + "px"; strip.style.height = cssH + "px";
      const sg = strip.getContext("2d");
      sg.fillStyle = "#fffdf8"; sg.fillRect(0, 0, strip.width, strip.height);
      sg.drawImage(canvas, 0, 0, strip.width, strip.height, 0, 0, strip.width, strip.height);
    }

    geom = {x0, y0, cw, ch, rows, cols};
    // A cell picked before is read again in this view; otherwise the line must not keep describing a cell
    // of the previous view (it is a live region: a screen reader would announce a number that is not here).
    if (cursor) showReadout(cursor.i, cursor.j);
    else clearReadout();
    updateEditButton();
    glass.heatmap = {
      name: r.name, local: r.local, layer: r.layer, head: r.head, grad: r.grad, step: r.step,
      rows, cols, n: r.n, m: r.m, start: r.start, axes: r.axes, values: data, masked: mask,
      rowLabels: r.rows, colLabels: r.cols, rowSums: sums, scale: sc, queryRow, queryCol, cssWidth: cssW,
      cellWidth: cw, cellHeight: ch, wrapWidth: wrapW,
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
    drawScaleBar($("legend-bar"), sc);
    $("legend-lo").textContent = fmt(sc.lo);
    $("legend-hi").textContent = fmt(sc.hi);
    $("legend-note").textContent = sc.note;
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
    const scale = el("p", {id: "howto-scale"}, "Colour: ");
    scale.append(el("b", {}, sc.note), ".");
    $("howto-text").replaceChildren(...howTo(r, c, sc).map((t) => el("p", {}, t)), scale);
    drawExplain(r);
  }

  // ------------------------------------------------------------------ the equation and the code line
  // From info.names[i].explain (glassllm.trace.explain): the equation in the lessons' notation, and the
  // statement of nn.py whose self.snap(...) call recorded the snapshot, with its neighbours. The plain-text
  // equation is typeset here: one-letter symbols in italics, X_sub as a subscript, function names upright.
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

  function drawExplain(r) {
    const meta = names[r.local], x = meta && meta.explain;
    $("explain").hidden = !x;
    if (!x) { glass.explain = null; return; }
    explainInto("explain", meta);
    glass.explain = {name: r.name, local: r.local, equation: x.equation.text, latex: x.equation.latex,
                     path: x.path, line: x.line, code: x.code, function: x.function};
  }

  // The equation, the site and the code with its neighbours of snapshot ``meta`` into #{prefix}-eq, -shape, ...
  function explainInto(prefix, meta) {
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

  // ------------------------------------------------------------------ save what you see
  // Each view's "save" buttons: PNG of what is drawn (the canvas; lists and tables drawn as a table), CSV and
  // JSON of its numbers. Every file names the prompt, the model and the view (snapshot, layer, head).
  function modelText() { return $("model-line").textContent; }

  // The numbers of a view as {title, fields (for the JSON), columns, rows: [[label, ...values]]}, or null.
  function viewTable(kind) {
    if (kind === "heatmap") {
      const h = glass.heatmap;
      if (!h) return null;
      const colLabel = (j) => h.colLabels ? `${j} ${h.colLabels[j]}` : String(j);
      const rowLabel = (i) => h.rowLabels && h.rowLabels.length ? `${current.row_pos[i]} ${h.rowLabels[i]}` : String(i);
      const rows = [];
      for (let i = 0; i < h.rows; i++) {
        const row = [rowLabel(i)];
        for (let j = 0; j < h.cols; j++) row.push(h.masked && h.masked[i * h.cols + j] ? "" : h.values[i * h.cols + j]);
        rows.push(row);
      }
      return {title: (h.grad ? "grad-" : "") + h.name + (h.head === null || h.head === undefined ? "" : `-head${h.head}`),
              fields: {snapshot: h.name, layer: h.layer, head: h.head, gradient: !!h.grad, step: h.step, axes: h.axes,
                       shape: [h.rows, h.cols], masked: h.masked ? Array.from(h.masked, Boolean) : null},
              columns: [`${h.axes[0]} \\ ${h.axes[1]}`, ...Array.from({length: h.cols}, (_, j) => colLabel(j))], rows};
    }
    if (kind === "next") {
      const x = glass.next;
      if (!x) return null;
      const top = ranked(x.probs, 12, x.logits);
      return {title: "next-token", fields: {snapshot: "probs", temperature: x.temperature, top_k: x.topK, top_p: x.topP,
                                            step: x.step},
              columns: ["id", "piece", "logit", "p", "sampled"],
              rows: top.map((id) => [id, info.vocab[id], x.logits[id], x.probs[id], x.sampled[id]])};
    }
    if (kind === "lens") {
      const r = glass.lens;
      if (!r) return null;
      return {title: "logit-lens", fields: {snapshot: "logit lens (resid streams through the final norm and output)"},
              columns: ["stream", ...r.pieces.map((p, i) => `${i} ${p}`)],
              rows: r.streams.map((name, s) => [name, ...r.top_pieces[s].map((p, i) => `${p} (${r.prob[s][i]})`)])};
    }
    if (kind === "attribution") {
      const r = glass.attribution;
      if (!r) return null;
      return {title: "attribution", fields: {snapshot: "direct logit attribution", token: r.token, piece: r.piece,
                                             position: r.position, total: r.total},
              columns: ["part", "logit"], rows: r.labels.map((label, i) => [label, r.values[i]])};
    }
    if (kind === "grid") {
      const g = glass.grid;
      if (!g) return null;
      const rows = [], k = g.size;
      for (let l = 0; l < g.layers; l++) for (let h = 0; h < g.heads; h++) for (let i = 0; i < k; i++) {
        const row = [`layer ${l} head ${h} query ${i}`];
        for (let j = 0; j < k; j++) row.push(g.values[((l * g.heads + h) * k + i) * k + j]);
        rows.push(row);
      }
      return {title: "all-heads" + (g.grad ? "-grad" : ""), fields: {snapshot: "attn.softmax", gradient: !!g.grad,
                                                                      shape: [g.layers, g.heads, k, k]},
              columns: ["layer, head, query \\ key", ...Array.from({length: k}, (_, j) => String(j))], rows};
    }
    return null;
  }

  function csvCell(v) {
    const s = typeof v === "number" ? String(v) : String(v ?? "");
    return /[",\n\r#]/.test(s) || /^\s|\s$/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  }

  function saveFile(name, blob) {
    const a = el("a", {href: URL.createObjectURL(blob), download: name});
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  }

  // A list or table view drawn as a table on a canvas, for its PNG.
  function tableCanvas(t) {
    const shown = t.rows.slice(0, 80);
    const widths = t.columns.map((c, j) => Math.min(160, Math.max(String(c).length, ...shown.map((r) =>
      String(typeof r[j] === "number" ? fmt(r[j]) : r[j]).length)) * 7 + 12));
    const W = widths.reduce((a, b) => a + b, 0), H = 22 * (shown.length + 2) + 8;
    const cv = el("canvas");
    cv.width = W; cv.height = H;
    const g = cv.getContext("2d");
    g.fillStyle = "#fffdf8"; g.fillRect(0, 0, W, H);
    g.font = "12px ui-monospace, monospace"; g.fillStyle = "#2b2a27"; g.textBaseline = "middle";
    g.fillText(`${t.title} · ${state.prompt.slice(0, 80)}`, 6, 12);
    [t.columns, ...shown].forEach((row, i) => {
      let x = 6;
      row.forEach((v, j) => {
        g.fillText(clip(String(typeof v === "number" ? fmt(v) : v), Math.floor(widths[j] / 7) - 1), x, 34 + 22 * i);
        x += widths[j];
      });
    });
    return cv;
  }

  function saveView(kind, format) {
    const t = viewTable(kind);
    if (!t) return null;
    const base = `glassllm-${t.title}`.replace(/[^\w.+-]+/g, "_");
    const about = {prompt: state.prompt, model: modelText(), view: kind, ...t.fields};
    let text = null;
    if (format === "csv") {
      text = Object.entries(about).filter(([k]) => k !== "masked")
        .map(([k, v]) => `# ${k}: ${typeof v === "string" ? v.replace(/[\r\n]+/g, " ") : JSON.stringify(v)}`).join("\n") + "\n" +
        [t.columns, ...t.rows].map((r) => r.map(csvCell).join(",")).join("\n") + "\n";
      saveFile(base + ".csv", new Blob([text], {type: "text/csv"}));
    } else if (format === "json") {
      text = JSON.stringify({...about, columns: t.columns, rows: t.rows});
      saveFile(base + ".json", new Blob([text], {type: "application/json"}));
    } else {
      const canvas = kind === "heatmap" ? $("heatmap") : kind === "grid" ? gridCanvas() : tableCanvas(t);
      canvas.toBlob((b) => saveFile(base + ".png", b), "image/png");
    }
    glass.saved = {kind, format, name: base + "." + format, text};
    return glass.saved;
  }

  // The head grid's thumbnails side by side on one canvas, as the grid shows them.
  function gridCanvas() {
    const thumbs = [...$("head-grid").querySelectorAll("canvas")];
    const H = glass.grid.heads, size = thumbs.length ? thumbs[0].width : 1;
    const cv = el("canvas");
    cv.width = H * (size + 4); cv.height = Math.ceil(thumbs.length / H) * (size + 4);
    const g = cv.getContext("2d");
    g.fillStyle = "#fffdf8"; g.fillRect(0, 0, cv.width, cv.height);
    thumbs.forEach((t, i) => g.drawImage(t, (i % H) * (size + 4), Math.floor(i / H) * (size + 4)));
    return cv;
  }

  function buildSave() {
    document.querySelectorAll(".save").forEach((box) => box.querySelectorAll("button").forEach((b) => {
      b.title = `save this view as ${b.dataset.format.toUpperCase()} (with the prompt, the model and the view's name)`;
      b.addEventListener("click", () => saveView(box.dataset.view, b.dataset.format));
    }));
  }

  // ------------------------------------------------------------------ step through one forward pass
  // The snapshots in forward order (info.names: embed, each layer's names, the final norm, logits, probs),
  // each shown for one position: its row (a query's scores or weights over the keys, a vector's features).
  const walk = {index: 0, timer: null, seq: 0};
  const PLAY_MS = 1600;                                   // a readable pace
  function walkSteps() {
    const out = [], L = info.model.n_layers;
    const held = info.names.filter((n) => n.held !== false);
    for (const n of held) if (!n.in_layer && n.name === "embed") out.push({local: n.name, layer: null});
    for (let l = 0; l < L; l++) for (const n of held) if (n.in_layer) out.push({local: n.name, layer: l});
    for (const n of held) if (!n.in_layer && n.name !== "embed") out.push({local: n.name, layer: null});
    return out;
  }

  function buildWalk() {
    $("walk-prev").addEventListener("click", () => walkTo(walk.index - 1));
    $("walk-next").addEventListener("click", () => walkTo(walk.index + 1));
    $("walk-play").addEventListener("click", () => (walk.timer ? stopPlay() : startPlay()));
    $("walk-pos").addEventListener("change", () => { state.query = Number($("walk-pos").value); walkTo(walk.index); });
    // ← and → step when the focus is not in a form control (which has its own use for them).
    document.addEventListener("keydown", (e) => {
      if (state.tab !== "walk" || e.altKey || e.ctrlKey || e.metaKey) return;
      if (e.target.closest && e.target.closest("input, select, textarea, [role=radiogroup], [role=tablist]")) return;
      const step = {ArrowRight: 1, ArrowLeft: -1}[e.key];
      if (!step) return;
      e.preventDefault();
      walkTo(walk.index + step);
    });
  }

  function startPlay() {
    if (walk.index >= walkSteps().length - 1) walkTo(0);
    $("walk-play").textContent = "❚❚ Pause"; $("walk-play").setAttribute("aria-pressed", "true");
    walk.timer = setInterval(() => {
      if (walk.index >= walkSteps().length - 1) stopPlay(); else walkTo(walk.index + 1);
    }, PLAY_MS);
  }
  function stopPlay() {
    if (walk.timer) clearInterval(walk.timer);
    walk.timer = null;
    $("walk-play").textContent = "▶ Play"; $("walk-play").setAttribute("aria-pressed", "false");
  }

  function showWalk() {
    const pos = $("walk-pos");
    pos.replaceChildren(...state.pieces.map((p, i) => el("option", {value: String(i)}, `${i}  ${show(p)}`)));
    if (state.query === null || state.query >= state.pieces.length) state.query = state.pieces.length - 1;
    pos.value = String(state.query);
    return walkTo(walk.index);
  }

  async function walkTo(index) {
    const steps = walkSteps();
    walk.index = Math.max(0, Math.min(steps.length - 1, index));
    const s = steps[walk.index], meta = names[s.local], seq = ++walk.seq;
    const full = (s.layer === null ? "" : `layers.${s.layer}.`) + s.local;
    const head = meta.heads ? Math.min(meta.head_axis === "H" ? heads.H : heads.G, meta.heads - 1) : undefined;
    $("walk-count").textContent = `${walk.index + 1} / ${steps.length}`;
    $("walk-prev").disabled = walk.index === 0;
    $("walk-next").disabled = walk.index === steps.length - 1;
    $("walk-name").textContent = full + (head === undefined ? "" : ` · ${meta.head_axis === "H" ? "query" : "key/value"} head ${head}`);
    if (meta.explain) explainInto("walk", meta);
    for (const [name, b] of mapNodes) {
      b.classList.toggle("walk-on", name === s.local);
      if (name === s.local) b.setAttribute("aria-current", "step"); else if (b.getAttribute("aria-current") === "step") b.removeAttribute("aria-current");
    }
    if ($("map-block-title") && s.layer !== null) $("map-block-title").textContent = `block ${s.layer} of ${info.model.n_layers}`;
    const body = {prompt: state.prompt, name: s.local};
    if (s.layer !== null) body.layer = s.layer;
    if (head !== undefined) body.head = head;
    let r;
    try {
      r = await ask("snapshot", body);
    } catch (e) {
      if (seq !== walk.seq) return;
      $("walk-error").textContent = e.message; $("walk-error").hidden = false;
      glass.walk = {index: walk.index, total: steps.length, name: full, local: s.local, layer: s.layer, head,
                    position: state.query, row: null, error: e.message};
      return;
    }
    if (seq !== walk.seq) return;                              // a later step was asked for meanwhile
    $("walk-error").hidden = true;
    const data = r.data || decode(r.values), mask = r.masked ? decode(r.masked) : null;
    const [rows, cols] = r.shape;
    const at = r.row_pos && r.row_pos.length ? r.row_pos.indexOf(state.query) : -1;
    const i = at >= 0 ? at : Math.min(state.query, rows - 1);
    const row = Array.from(data.slice(i * cols, (i + 1) * cols));
    const rowMask = mask ? Array.from(mask.slice(i * cols, (i + 1) * cols)) : null;
    const c = info.model;
    const sizes = {n: state.ids.length, m: state.ids.length, H: c.n_heads, G: c.n_kv_heads, D: c.head_dim, C: c.dim,
                   F: c.ffn_dim, V: c.vocab_size};
    $("walk-shape").textContent = `(${meta.axes.map((a) => `${a} = ${sizes[a]}`).join(", ")})`;
    const rowName = r.axes[0] === "m" ? "key" : "query";
    $("walk-what").textContent = cols === 1
      ? `Position ${state.query} (${show(state.pieces[state.query])}): one number, ${fmt(row[0])}.`
      : `Row ${i} of ${rows}: the ${rowName} at position ${r.row_pos ? r.row_pos[i] : i} ` +
        `(${show(state.pieces[r.row_pos ? r.row_pos[i] : i])}), ${cols} values` +
        (r.col_kind === "token" ? ", one per key" : r.col_kind === "vocab" ? ", one per vocabulary id" : "") +
        (rowMask && rowMask.some(Boolean) ? `; ${rowMask.filter(Boolean).length} future keys masked (·)` : "") + ".";
    const sc = scaleFor(r, data, mask);
    const strip = $("walk-strip"), W = Math.max(200, strip.clientWidth || 600);
    strip.width = W; strip.height = 28;
    const g = strip.getContext("2d");
    g.imageSmoothingEnabled = false;
    g.clearRect(0, 0, W, 28);
    g.drawImage(cellsImage(row, rowMask, 1, cols, sc), 0, 0, W, 28);
    const label = (j) => r.col_kind === "token" ? `${show(r.cols[j])} ` : r.col_kind === "vocab" ? `${show(info.vocab[j])} ` : "";
    const shown = Math.min(cols, 48);
    $("walk-values").textContent = row.slice(0, shown).map((v, j) => `${label(j)}${rowMask && rowMask[j] ? "·" : fmt(v, 3)}`)
      .join("  ") + (cols > shown ? `  … (${cols - shown} more)` : "");
    glass.walk = {index: walk.index, total: steps.length, name: full, local: s.local, layer: s.layer, head,
                  position: state.query, row, rowIndex: i, masked: rowMask, shape: r.shape, axes: r.axes,
                  equation: meta.explain ? meta.explain.equation.text : null,
                  line: meta.explain ? meta.explain.line : null, playing: !!walk.timer};
  }

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
    const v = r.data[i * geom.cols + j];
    // exact: every bit (for tests and copying); shown: at the dtype's precision.
    return {where: colTxt ? `${rowTxt} → ${colTxt}` : rowTxt, exact: String(v), shown: precise(v, r.values.dtype), masked};
  }

  const readoutHint = $("readout").textContent;   // the page's own words for "nothing read yet"

  function clearReadout() {
    const ro = $("readout");
    ro.textContent = readoutHint;
    delete ro.dataset.row; delete ro.dataset.col; delete ro.dataset.value;
  }

  function showReadout(i, j) {
    const c = describeCell(i, j), ro = $("readout");
    ro.textContent = `${c.where}: ${c.shown}${c.masked ? " (masked)" : ""}`;
    ro.dataset.row = String(i); ro.dataset.col = String(j); ro.dataset.value = c.exact;
  }

  // Show cell (i, j)'s exact value: tooltip next to the viewport point (cx, cy), outline, and the readout line
  // (a live region, so a screen reader announces it). ``pick``: the arrow keys or a click chose this cell
  // (the one "Edit cell" sets); hovering only shows it.
  function showCell(i, j, cx, cy, pick) {
    if (pick) cursor = {i, j};
    const {where, exact, shown, masked} = describeCell(i, j);
    const tip = $("tooltip");
    tip.replaceChildren(
      el("div", {class: "small muted"}, where),
      el("div", {class: "mono big"}, shown),
      el("div", {class: "small muted"}, current.values.dtype),
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
        drawModeLine(r.paths);
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
    bars.replaceChildren(barColumns("candidate", "p (track 0 … 1)", "p", "sampled"));
    const top = ranked(probs, 12, z);
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
          drawNext();                                        // the picked candidate is marked at once
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

  // The column headings of a list of bars, in the bars' own grid.
  function barColumns(piece, track, p, q) {
    const li = el("li", {class: "cols small muted"});
    li.append(el("span"), el("span", {}, piece), el("span", {}, track), el("span", {class: "p"}, p),
              el("span", {class: "q"}, q));
    return li;
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
    $("iv-note").textContent = ivNote(state.intervention);
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

  // ------------------------------------------------------------------ tabs: heatmap, model map, all heads, training
  const TABS = ["heatmap", "map", "heads", "training", "walk"];
  function showTab(name) {
    state.tab = name;
    $("tabs").querySelectorAll("button").forEach((b) => {
      const on = b.dataset.tab === name;
      b.classList.toggle("on", on);
      b.setAttribute("aria-selected", String(on));
      b.tabIndex = on ? 0 : -1;
    });
    for (const t of TABS) $("panel-" + t).hidden = t !== name;
    hideCell();
    if (name === "heatmap" && current) draw();                 // its frame may have changed size while hidden
    // One model map: it sits in the Model map tab, or under the step-through while walking.
    const map = $("model-map");
    if (name === "walk") $("walk-map").append(map); else $("panel-map").append(map);
    if (name === "map") updateMap();
    if (name !== "walk") stopPlay();
    if (name === "walk") return showWalk();
    if (name === "heads") return loadGrid();
    if (name === "training") return showTraining();
    return Promise.resolve();
  }

  function buildTabs() {
    const tabs = $("tabs");
    tabs.querySelectorAll("button").forEach((b) => b.addEventListener("click", () => {
      const shown = showTab(b.dataset.tab);
      // Clicked open, the walk takes the focus, so that ← → step through it at once (in the tab list they
      // move between tabs).
      if (b.dataset.tab === "walk") $("walk-next").focus();
      return shown;
    }));
    tabs.addEventListener("keydown", (e) => {
      const step = {ArrowRight: 1, ArrowLeft: -1}[e.key];
      if (!step) return;
      const shown = [...tabs.querySelectorAll("button:not([hidden])")];
      const at = shown.indexOf(document.activeElement);
      if (at < 0) return;
      e.preventDefault();
      const to = shown[(at + step + shown.length) % shown.length];
      to.focus();
      showTab(to.dataset.tab);
    });
  }

  // ------------------------------------------------------------------ the model map
  // Drawn from info.names, the tracer's registry in forward order: one row per module (the name's first
  // part), the names inside the blocks framed as one block. A name the registry gains appears by itself.
  const mapNodes = new Map();          // local name -> its button
  function buildMap() {
    const box = $("model-map");
    box.replaceChildren();
    mapNodes.clear();
    const start = el("div", {class: "map-row"});
    start.append(el("span", {class: "map-module label"}, "input"), el("span", {class: "map-node fixed", id: "map-tokens"}, "tokens"));
    box.append(start);
    let block = null, row = null, module = null;
    for (const n of info.names) {
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
      mapNodes.set(n.name, b);
    }
  }

  // Open a view in the heatmap tab (from the map or the grid).
  function openView(sel) {
    showTab("heatmap");
    return userSelect(sel);
  }

  // Shapes for the current prompt and step, the block's layer, and the node on show.
  function updateMap() {
    if (!mapNodes.size) return;
    const c = info.model, L = c.n_layers;
    const n = state.step ? 1 : state.ids.length, m = state.ids.length + state.step;
    const sizes = {n, m, H: c.n_heads, G: c.n_kv_heads, D: c.head_dim, C: c.dim, F: c.ffn_dim, V: c.vocab_size};
    $("map-tokens").textContent = `tokens (${n} ${state.step ? `new, ${m - 1} cached` : "ids"})`;
    $("map-block-title").textContent = `block ${state.layer} of ${L} (layers 0 … ${L - 1} repeat it; ` +
      "the Layer buttons above choose one)";
    for (const [name, b] of mapNodes) {
      const meta = names[name];
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

  // ------------------------------------------------------------------ the head grid
  function gridBody() {
    const body = {prompt: state.prompt};
    if (state.grad) body.grad = true;
    if (state.grad && state.target !== null) body.target = state.target;
    if (state.intervention) body.intervention = state.intervention;
    return body;
  }

  // One colour scale for every thumbnail: weights on the fixed 0 … 1, gradients symmetric around 0.
  function gridScale(r) {
    if (!r.grad) return {kind: "seq", lo: 0, hi: 1, note: "fixed scale 0 … 1: white is 0, darkest blue is 1"};
    let a = 0;
    for (const v of r.data) if (Number.isFinite(v)) a = Math.max(a, Math.abs(v));
    a = a || 1;
    return {kind: "div", lo: -a, hi: a, note: "symmetric scale −a … a, a = the largest |value| of any head: white is 0, " +
      "blue below, red above"};
  }

  async function loadGrid() {
    if (!state.prompt || state.tab !== "heads") return;
    await busy(async () => {
      const body = gridBody();
      try {
        const r = await ask("heads", body);
        if (requestKey("heads", gridBody()) !== requestKey("heads", body)) return;     // superseded
        r.data = r.data || decode(r.values);
        r.mask = r.mask || decode(r.masked);
        $("grid-error").hidden = true;
        drawGrid(r);
      } catch (e) {
        if (requestKey("heads", gridBody()) !== requestKey("heads", body)) return;
        $("grid-error").textContent = e.message;
        $("grid-error").hidden = false;
        $("head-grid").replaceChildren();
        glass.grid = null;
      }
    });
  }

  function drawGrid(r) {
    const [L, H, k] = r.values.shape;
    const sc = gridScale(r);
    const box = $("head-grid");
    const size = Math.max(48, Math.min(150, Math.floor((box.clientWidth - 70) / H) - 8));
    box.style.gridTemplateColumns = `auto repeat(${H}, ${size + 6}px)`;
    const parts = [el("span")];
    for (let h = 0; h < H; h++) parts.push(el("span", {class: "label"}, `head ${h}`));
    for (let l = 0; l < L; l++) {
      parts.push(el("span", {class: "label"}, `layer ${l}`));
      const mask = r.mask.subarray(l * k * k, (l + 1) * k * k);
      for (let h = 0; h < H; h++) {
        const b = el("button", {type: "button", class: "thumb", "data-layer": String(l), "data-head": String(h)});
        b.setAttribute("aria-label", `layer ${l}, head ${h}: open its ${r.grad ? "gradient" : "weights"}`);
        const cv = el("canvas");
        paint(cv, r.data.subarray((l * H + h) * k * k, (l * H + h + 1) * k * k), k, k, mask, sc, size, size);
        b.append(cv);
        b.addEventListener("click", () => openView({name: "attn.softmax", layer: l, head: h}));
        const tip = (ev) => {
          const t = $("tooltip");
          t.replaceChildren(el("div", {class: "big"}, `layer ${l}, head ${h}`),
                            el("div", {class: "small muted"}, "click to open this head"));
          t.dataset.layer = String(l); t.dataset.head = String(h);
          const at = b.getBoundingClientRect();
          t.style.left = at.right + window.scrollX + 6 + "px"; t.style.top = at.top + window.scrollY + "px";
          t.hidden = false;
        };
        b.addEventListener("mouseenter", tip);
        b.addEventListener("focus", tip);
        b.addEventListener("mouseleave", hideCell);
        b.addEventListener("blur", hideCell);
        parts.push(b);
      }
    }
    box.replaceChildren(...parts);
    drawScaleBar($("grid-legend-bar"), sc);
    $("grid-legend-lo").textContent = fmt(sc.lo);
    $("grid-legend-hi").textContent = fmt(sc.hi);
    $("grid-legend-note").textContent = sc.note;
    const what = r.grad ? `∂ loss / ∂ attn.softmax, loss = −log p(${JSON.stringify(r.target_piece)}) at the last position`
      : "attn.softmax, the attention weights";
    $("grid-title").textContent = `Every layer and head of the prompt's pass: ${what}` +
      (state.intervention ? `, with intervention: ${ivText(state.intervention)}` : "") +
      (state.step ? " (the grid shows the prompt's pass, not the decoding step)" : "") + ".";
    const howto = [
      "Each thumbnail is one head's pattern: rows are queries, columns keys, as in the heatmap. Hatched cells are " +
      "future keys (masked). Hover for the layer and head; click to open it in the heatmap.",
      "Patterns to look for: a diagonal just below the main one is a previous-token head; a stripe a fixed distance " +
      "back in a repeated text is an induction head (each token reads the token after its earlier copy).",
    ];
    if (r.block > 1) howto.push(`This prompt has ${r.n} tokens: each thumbnail cell is the mean of a ${r.block} × ` +
      `${r.block} block of cells (masked cells left out); the heatmap shows every cell.`);
    if (r.grad) howto.push("These are gradients: red raises the loss, blue lowers it.");
    const scale = el("p", {id: "grid-howto-scale"}, "Colour: ");
    scale.append(el("b", {}, sc.note), ".");
    $("grid-howto").replaceChildren(...howto.map((t) => el("p", {}, t)), scale);
    glass.grid = {layers: L, heads: H, size: k, block: r.block, grad: r.grad, values: r.data, masked: r.mask, scale: sc};
  }

  function drawScaleBar(c, sc) {
    const g = c.getContext("2d"), lut = LUT[sc.kind];
    for (let x = 0; x < c.width; x++) {
      const k = Math.round((x / (c.width - 1)) * 255) * 3;
      g.fillStyle = `rgb(${lut[k]},${lut[k + 1]},${lut[k + 2]})`;
      g.fillRect(x, 0, 1, c.height);
    }
  }

  // ------------------------------------------------------------------ before / after an intervention
  // What an intervention changes and what it leaves, in words.
  function ivNote(iv) {
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

  async function updateCompare(body) {
    const box = $("compare");
    if (!body.intervention) { box.hidden = true; glass.compare = null; return; }
    const plainBody = {...body};
    delete plainBody.intervention;
    let before;
    try {
      before = await ask("snapshot", plainBody);
    } catch (e) {
      box.hidden = true; glass.compare = null; return;
    }
    if (requestKey("snapshot", snapshotBody()) !== requestKey("snapshot", body)) return;    // superseded
    const after = current;
    before.data = before.data || decode(before.values);
    before.mask = before.masked ? (before.mask || decode(before.masked)) : null;
    const [rows, cols] = after.shape;
    const diff = new Float64Array(rows * cols);
    let big = 0, at = 0;
    for (let i = 0; i < diff.length; i++) {
      const d = after.data[i] - before.data[i];
      diff[i] = Number.isFinite(d) ? d : 0;                     // −∞ − (−∞) of a masked score: no change
      if (Math.abs(diff[i]) > big) { big = Math.abs(diff[i]); at = i; }
    }
    // Before and after share one scale (the heatmap's, widened to hold both); the difference is symmetric.
    let sc = scaleFor(after, after.data, after.mask);
    if (sc.note.startsWith("fixed") === false) {
      const other = scaleFor(after, before.data, before.mask);
      sc = {...sc, lo: Math.min(sc.lo, other.lo), hi: Math.max(sc.hi, other.hi)};
    }
    const dsc = {kind: "div", lo: -(big || 1), hi: big || 1};
    const W = Math.max(90, Math.floor(($("panel-heatmap").clientWidth - 40) / 3));
    const Hpx = Math.max(40, Math.min(220, Math.round(W * rows / cols)));
    paint($("compare-before"), before.data, rows, cols, before.mask, sc, W, Hpx);
    paint($("compare-after"), after.data, rows, cols, after.mask, sc, W, Hpx);
    paint($("compare-diff"), diff, rows, cols, null, dsc, W, Hpx);
    const iv = body.intervention;
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

  // ------------------------------------------------------------------ the training timeline
  // The run's probe (a span written twice) at log-spaced steps: a step slider beside the loss curve and each
  // head's induction score; the L x H patterns, the sample and the next-token guess at the chosen step.
  let timeline = null;

  async function showTraining() {
    if (!info.timeline) return;
    await busy(async () => {
      const box = $("panel-training");
      try {
        if (!timeline) {
          const r = await ask("timeline", {});
          timeline = {...r, attn: decode(r.attn), probs: decode(r.probs), induction: decode(r.induction)};
          buildTraining(box);
        }
        showStep(Number($("tl-slider").value));
      } catch (e) {
        box.replaceChildren(el("p", {class: "error"}, e.message));
      }
    });
  }

  function buildTraining(box) {
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
                 el("ol", {id: "tl-next", class: "bars"}), el("p", {class: "label"}, "sample at this step"),
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
    drawScaleBar($("tl-legend-bar"), TL_SCALE);
    t.selected = bestHead(S - 1);
  }

  const TL_SCALE = {kind: "seq", lo: 0, hi: 1, note: "fixed scale 0 … 1: white is 0, darkest blue is 1"};

  // The head with the highest induction score at step index s: {layer, head, score}.
  function bestHead(s) {
    const t = timeline, L = info.model.n_layers, H = info.model.n_heads;
    let best = {layer: 0, head: 0, score: -1};
    for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
      const v = t.induction[(s * L + l) * H + h];
      if (v > best.score) best = {layer: l, head: h, score: v};
    }
    return best;
  }

  function showStep(s) {
    const t = timeline, L = info.model.n_layers, H = info.model.n_heads, n = t.ids.length, P = t.period;
    const row = t.rows[s];
    $("tl-step").textContent = `${nice(t.steps[s])} (${s + 1} of ${t.steps.length})`;
    const parts = [`step ${nice(row.step)}`, `${nice(row.tokens)} tokens seen`, `lr ${fmt(row.lr)}`];
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
        paint(cv, at(l, h), n, n, mask, TL_SCALE, size, size);
        b.append(cv);
        b.addEventListener("click", () => { t.selected = {layer: l, head: h}; showStep(Number($("tl-slider").value)); });
        cells.push(b);
      }
    }
    grid.replaceChildren(...cells);
    $("tl-grid-title").textContent = `Every layer and head on the probe at step ${nice(row.step)}; click one to see it large.`;

    // The chosen head, large, with the induction cells outlined.
    const {layer, head} = t.selected;
    const big = $("tl-head"), side = Math.max(160, Math.min(300, $("panel-training").clientWidth - 560));
    paint(big, at(layer, head), n, n, mask, TL_SCALE, side, side);
    const g = big.getContext("2d"), c = side / n;
    g.strokeStyle = "#e8871e"; g.lineWidth = 1;
    for (let i = P; i < n; i++) g.strokeRect((i - P + 1) * c + 0.5, i * c + 0.5, Math.max(1, c - 1), Math.max(1, c - 1));
    $("tl-head-title").textContent = `layer ${layer}, head ${head} at step ${nice(row.step)} (induction score ` +
      `${t.induction[(s * L + layer) * H + head].toFixed(3)}; orange: the cells it scores)`;

    // The next-token guess after the probe.
    const probs = t.probs.subarray(s * info.model.vocab_size, (s + 1) * info.model.vocab_size);
    const list = $("tl-next");
    list.replaceChildren(barColumns("candidate", "p (track 0 … 1)", "p", ""));
    for (const id of ranked(probs, 5)) {
      const li = el("li", {class: "bar", "data-id": String(id)});
      const track = el("span", {class: "track"}), fill = el("span", {class: "fill"});
      fill.style.width = (100 * probs[id]).toFixed(2) + "%";
      track.append(fill);
      li.append(el("span"), el("span", {class: "piece mono"}, clip(show(info.vocab[id]), 14)), track,
                el("span", {class: "p mono"}, fmt(probs[id])), el("span"));
      list.append(li);
    }
    drawCurves(s);
    glass.timeline = {index: s, step: row.step, selected: {...t.selected}, pattern: Array.from(at(layer, head)),
                      best, scores: Array.from(t.induction)};
  }

  // Loss and induction scores against log(step + 1), with the chosen step marked on both.
  function drawCurves(s) {
    const t = timeline, L = info.model.n_layers, H = info.model.n_heads, S = t.steps.length;
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

  // ------------------------------------------------------------------ start
  async function start() {
    try {
      info = await source.info();
    } catch (e) {
      $("model-line").textContent = "cannot reach the inspector's server: " + e.message;
      return;
    }
    glass.info = info;
    buildControls();
    buildTabs();
    buildMap();
    buildWalk();
    buildSave();
    readIntervention();
    const boot = embedded ? embedded.prompt : (info.prompt || "Once upon a time there was a little dog");
    $("prompt").value = boot;
    if (embedded) {
      $("prompt").readOnly = true;
      $("run").disabled = true;
    }
    state.layer = 0; state.head = 0;
    state.name = names["attn.softmax"] && names["attn.softmax"].held ? "attn.softmax"
      : info.names.find((n) => n.held).name;
    syncControls();
    if (info.timeline) $("tabs").querySelector("[data-tab=training]").hidden = false;
    await runPrompt();
    if (info.tab && info.timeline && TABS.includes(info.tab)) await showTab(info.tab);
    glass.ready = true;
    document.body.dataset.ready = "1";
  }
  glass.started = start();
})();
