// prompt.js: the Prompt card: running a prompt (its tokens, then every view of its pass), and the token
// chips, each of which picks its position in the heatmap.
"use strict";

const Prompt = (() => {
  async function run() {
    // Offline, the one embedded prompt as it was (a textarea would turn its "\r\n" into "\n").
    const text = Api.embedded ? Api.embedded.prompt : $("prompt").value;
    state.error = null;
    await Api.load("prompt", "tokens", {prompt: text}, {
      draw: async (t) => {
        if (text !== state.prompt) state.target = null;
        if (text !== state.prompt) Interventions.forgetEdit();
        state.prompt = text; state.ids = t.ids; state.pieces = t.pieces; state.step = 0;
        state.finished = null;
        $("prompt-note").textContent = `${t.ids.length} token${t.ids.length === 1 ? "" : "s"}` + (state.mode === "export"
          ? " · this offline page holds one prompt; run `glassllm inspect` to try others" : "");
        $("prompt-note").classList.remove("error");
        Controls.sync();
        await Promise.all([Heatmap.load(), Next.load(), Lens.load(), Lens.loadAttribution()]);
      },
      fail: (message) => {
        $("prompt-note").textContent = message + " (the views below still show the previous prompt)";
        $("prompt-note").classList.add("error");
      },
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
    if (state.tab === "walk" && state.query !== null) { $("walk-pos").value = String(state.query); Walk.redraw(); }
    if (!state.snapshot) return;
    Heatmap.draw();
    const {queryRow: i, queryCol: j} = glass.heatmap;
    if (i >= 0) { state.cell = {i, j: Math.max(j, 0)}; Cells.showReadout(i, state.cell.j); Interventions.updateEditButton(); }
  }

  function build() {
    $("prompt-form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); run(); }
    });
  }

  return {build, run, drawTokens};
})();
