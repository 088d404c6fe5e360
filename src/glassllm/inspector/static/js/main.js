// main.js: the page's start: ask for the model's description, build every card's controls, run the first
// prompt; and the methods of `glass`, which drive the page as its controls do (for tests and tools).
"use strict";

Object.assign(glass, {
  requestKey: Api.requestKey, colors: Paint.COLORS,
  // Select layer / snapshot / head / gradient, like the page's controls; resolves once drawn.
  async select(sel) { Object.assign(state, Controls.normalizeSelection(sel)); Controls.sync(); await Heatmap.load(); },
  async run(prompt) { $("prompt").value = prompt; await Prompt.run(); },
  async setTemperature(T) { $("temperature").value = String(T); Next.onSampling(); },
  async step() { await Generate.step(); },
  async reset() { await Generate.reset(); },
  async intervene(iv) { Interventions.set(iv); await Interventions.apply(); },
  idle() { return Api.idle(); },
  tab(name) { return Tabs.show(name); },
  walkTo(index) { return Walk.to(index); },
  save(kind, format) { return Save.save(kind, format); },
});

glass.started = (async function start() {
  let info;
  try {
    info = await Api.source.info();
  } catch (e) {
    $("model-line").textContent = "cannot reach the inspector's server: " + e.message;
    return;
  }
  state.info = glass.info = info;
  // A notebook view holds only some snapshots (info.offline): the others are listed as absent.
  const held = info.offline ? new Set(info.offline.held) : null;
  for (const n of info.names) {
    state.names[n.name] = n;
    n.held = !held || held.has(n.name);
  }
  for (const part of [Controls, Interventions, Next, Generate, Prompt, Cells, Heatmap, Tabs, ModelMap, Walk, Save]) {
    part.build();
  }
  Interventions.read();
  const boot = Api.embedded ? Api.embedded.prompt : (info.prompt || "Once upon a time there was a little dog");
  $("prompt").value = boot;
  if (Api.embedded) {
    $("prompt").readOnly = true;
    $("run").disabled = true;
  }
  state.layer = info.first_layer || 0; state.head = 0;        // a recorded trace's page: its first recorded layer
  state.name = state.names["attn.softmax"] && state.names["attn.softmax"].held ? "attn.softmax"
    : info.names.find((n) => n.held).name;
  Controls.sync();
  if (info.timeline) $("tabs").querySelector("[data-tab=training]").hidden = false;
  await Prompt.run();
  if (info.tab && info.timeline && Tabs.names.includes(info.tab)) await Tabs.show(info.tab);
  glass.ready = true;
  document.body.dataset.ready = "1";
})();
