// cells.js: reading the heatmap one cell at a time: hovering shows a cell's exact value, a click or the
// arrow keys pick one (the cell "Edit cell" sets), and the readout line says it in words.
"use strict";

const Cells = (() => {
  function hide() {
    $("tooltip").hidden = true;
    $("cell-outline").hidden = true;
  }

  // The cell under the mouse, or null.
  function cellAt(ev) {
    const geom = state.layout;
    if (!geom || !state.snapshot) return null;
    const b = $("heatmap").getBoundingClientRect();
    const j = Math.floor((ev.clientX - b.left - geom.x0) / geom.cw), i = Math.floor((ev.clientY - b.top - geom.y0) / geom.ch);
    return i < 0 || j < 0 || i >= geom.rows || j >= geom.cols ? null : {i, j};
  }

  // Hovering shows a cell's value; it does not pick the cell (the mouse crosses many on its way to a button).
  function onHover(ev) {
    const at = cellAt(ev);
    if (!at) { hide(); return; }
    showCell(at.i, at.j, ev.clientX, ev.clientY, false);
  }

  function onClick(ev) {
    const at = cellAt(ev);
    if (at) showCell(at.i, at.j, ev.clientX, ev.clientY, true);
  }

  // With the heatmap focused: arrows move one cell, Home / End go to the row's first / last cell,
  // Page Up / Page Down to the column's first / last; Escape hides the value. The first key shows cell (0, 0).
  function onKey(ev) {
    const geom = state.layout, cursor = state.cell;
    if (!geom || !state.snapshot) return;
    if (ev.key === "Escape") { hide(); return; }
    if ((ev.key === "e" || ev.key === "E") && cursor) { ev.preventDefault(); Interventions.editCell(); return; }
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

  // Cell (i, j) of the current view in words: {where, exact, shown, masked}.
  function describe(i, j) {
    const r = state.snapshot, cols = state.layout.cols;
    const masked = r.mask ? !!r.mask[i * cols + j] : false;
    const rowTxt = r.rows.length ? `${r.axes[0] === "m" ? "key" : (r.col_kind === "token" ? "query" : "position")} ` +
      `${r.row_pos[i]} ${JSON.stringify(r.rows[i])}` : `row ${i}`;
    let colTxt;
    if (r.col_kind === "token") colTxt = `key ${j} ${JSON.stringify(r.cols[j])}`;
    else if (r.col_kind === "vocab") colTxt = `id ${j} "${state.info.vocab[j]}"`;
    else if (r.col_kind === "none") colTxt = "";
    else colTxt = `${r.axes[1]} ${j}`;
    const v = r.data[i * cols + j];
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
    const c = describe(i, j), ro = $("readout");
    ro.textContent = `${c.where}: ${c.shown}${c.masked ? " (masked)" : ""}`;
    ro.dataset.row = String(i); ro.dataset.col = String(j); ro.dataset.value = c.exact;
  }

  // Show cell (i, j)'s exact value: tooltip next to the viewport point (cx, cy), outline, and the readout line
  // (a live region, so a screen reader announces it). ``pick``: the arrow keys or a click chose this cell
  // (the one "Edit cell" sets); hovering only shows it.
  function showCell(i, j, cx, cy, pick) {
    if (pick) state.cell = {i, j};
    const geom = state.layout;
    const {where, exact, shown, masked} = describe(i, j);
    const tip = $("tooltip");
    tip.replaceChildren(
      el("div", {class: "small muted"}, where),
      el("div", {class: "mono big"}, shown),
      el("div", {class: "small muted"}, state.snapshot.values.dtype),
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
    Interventions.updateEditButton();
  }

  function build() {
    const canvas = $("heatmap");
    canvas.addEventListener("mousemove", onHover);
    canvas.addEventListener("click", onClick);       // a click picks the cell (for editing), as the arrow keys do
    canvas.addEventListener("mouseleave", hide);
    canvas.addEventListener("keydown", onKey);       // the canvas takes the focus (tabindex 0): arrows walk its cells
    canvas.addEventListener("blur", hide);
  }

  return {build, hide, clearReadout, showReadout};
})();
