// tabs.js: the tabs over the view card (Heatmap, Model map, All heads, Step through, Training): one panel on
// show at a time, the ← → keys moving between tabs.
"use strict";

const Tabs = (() => {
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
    Cells.hide();
    if (name === "heatmap" && state.snapshot) Heatmap.draw();   // its frame may have changed size while hidden
    // One model map: it sits in the Model map tab, or under the step-through while walking.
    const map = $("model-map");
    if (name === "walk") $("walk-map").append(map); else $("panel-map").append(map);
    if (name === "map") ModelMap.update();
    if (name !== "walk") Walk.stop();
    if (name === "walk") return Walk.open();
    if (name === "heads") return Grid.load();
    if (name === "training") return Training.open();
    return Promise.resolve();
  }

  function build() {
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

  return {build, show: showTab, names: TABS};
})();
