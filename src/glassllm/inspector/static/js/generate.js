// generate.js: the "Generate, step by step" card: greedy decoding steps with the KV cache, one at a time,
// and back to the prompt. The heatmap and the next-token card follow the step.
"use strict";

const Generate = (() => {
  let stepping = false;              // one step at a time

  function drawStepLine(r) {
    const line = $("step-line");
    if (!r.step) line.textContent = `step 0: the prompt, n = ${plural(r.m, "query", "queries")}, ` +
      `m = ${plural(r.m, "key")}, nothing cached yet`;
    else line.textContent = `step ${r.step}: fed "${r.fed.piece}" · n = 1 · m = ${r.m} ` +
      `(${r.m - 1} cached + 1 new)`;
    if (r.finished) line.textContent += ` · ${r.finished}`;
    if (!r.finished && !nextStepSaved(r.step)) line.textContent += " · the last step saved in this offline page";
    $("step").disabled = !canStep(r.step, r.finished);
    line.dataset.step = String(r.step); line.dataset.m = String(r.m);
  }

  // Offline, a step exists only if the export saved it; live, until the text ends.
  function nextStepSaved(step) {
    const embedded = Api.embedded;
    return !embedded || !!embedded.responses[Api.requestKey("next", {prompt: state.prompt, step: step + 1})];
  }
  function canStep(step, finished) { return !finished && nextStepSaved(step); }

  async function step() {
    if (!state.prompt || state.finished || stepping) return;
    stepping = true;
    $("step").disabled = true;
    const before = state.step;
    state.step += 1;
    if (state.grad) state.grad = false;
    Controls.sync();
    try {
      await Promise.all([Next.load(), Heatmap.load()]);
    } finally {
      stepping = false;
    }
    if (Number($("step-line").dataset.step) !== state.step) {      // the step did not load: stay where we were
      state.step = before;
      Controls.sync();
      $("step").disabled = !canStep(state.step, state.finished);
    }
  }

  async function reset() {
    state.step = 0;
    Controls.sync();
    await Promise.all([Next.load(), Heatmap.load()]);
  }

  function build() {
    $("step").addEventListener("click", () => step());
    $("reset").addEventListener("click", () => reset());
  }

  return {build, drawStepLine, step, reset};
})();
