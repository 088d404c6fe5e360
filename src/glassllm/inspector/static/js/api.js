// api.js: where the page's answers come from, and the one way every panel asks for them (`Api.load`).
//
// Answers come through one interface, `source.get(kind, body)`, answered by the local server
// (POST /api/<kind>), by a notebook's kernel (messages to the frame's parent), or, in an exported HTML file,
// by the responses embedded in the page under the same canonical request keys (schema.request_key in Python).
"use strict";

const Api = (() => {
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

  // Does the forward pass compute snapshot (name, layer) of ``view`` strictly before the one ``iv`` changes?
  // info.names is in forward order: embed, one layer's names, then the final norm and the logits.
  function upstream(info, view, iv) {
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
      if (!r && kind === "snapshot" && body.intervention && !body.grad && upstream(embedded.info, body, body.intervention)) {
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
  state.mode = source.mode;

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

  const cache = new Map();           // request key -> response (least recently used first)
  const CACHE_LIMIT = 96;

  // One answer, from the cache or the source; a refused request rejects with the source's one-line message.
  async function ask(kind, body) {
    const key = requestKey(kind, body);
    if (cache.has(key)) { const v = cache.get(key); cache.delete(key); cache.set(key, v); return v; }
    const v = await source.get(kind, body);
    cache.set(key, v);
    while (cache.size > CACHE_LIMIT) cache.delete(cache.keys().next().value);
    return v;
  }

  // Work under way: glass.idle() resolves once there is none.
  let waiters = [];
  function idle() {
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

  // The number of each panel's newest request.
  const newest = new Map();

  // Ask for one panel's answer and draw it: every panel of the page asks this way.
  //
  // `draw(answer, isNewest)` draws the answer (`isNewest()`: whether this is still the panel's newest request,
  // for a draw that waits on more answers). A request that cannot be answered shows its one-line message:
  // in the panel's error line (`error`, an element id: shown with the message, hidden by the next answer), and
  // through `fail(message)`, which clears what would describe the panel's previous view. A newer request of
  // the same panel supersedes an older one: whatever order the answers come back in, only the newest is drawn
  // (the older still fills the cache, for a reader who goes back). glass.idle() waits for the whole load.
  function load(panel, kind, body, {draw, error = null, fail = null}) {
    const seq = (newest.get(panel) || 0) + 1;
    newest.set(panel, seq);
    const isNewest = () => newest.get(panel) === seq;
    return busy(async () => {
      try {
        const answer = await ask(kind, body);
        if (!isNewest()) return;
        if (error) $(error).hidden = true;
        await draw(answer, isNewest);
      } catch (e) {
        if (!isNewest()) return;
        if (error) { $(error).textContent = e.message; $(error).hidden = false; }
        if (fail) await fail(e.message);
      }
    });
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

  return {embedded, source, requestKey, ask, load, idle, decode};
})();
