// paint.js: matrices as colours: the colour maps, the scale a view is drawn on, and painting cells (with the
// masked ones hatched) onto a canvas. The heatmap, the head grid, the before/after panels, the step-through
// and the training timeline all paint through here.
//
// Colour maps: sequential (white -> ink blue) for weights and probabilities, diverging (blue - white - red)
// for signed values and gradients, and the masked cells' ground and hatching. They are defined once in Python
// (glassllm.trace.colors, which Trace.plot uses too); the server and the export put them in the page as
// <script id="glass-colors">.
"use strict";

const Paint = (() => {
  const COLORS = JSON.parse(document.getElementById("glass-colors").textContent);
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

  // The colour scale of snapshot answer ``r`` (its values ``data``, cells ``mask`` left out): {kind, lo, hi, note}.
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

  // A legend's colour bar: scale ``sc`` from its low end (left) to its high end (right).
  function scaleBar(c, sc) {
    const g = c.getContext("2d"), lut = LUT[sc.kind];
    for (let x = 0; x < c.width; x++) {
      const k = Math.round((x / (c.width - 1)) * 255) * 3;
      g.fillStyle = `rgb(${lut[k]},${lut[k + 1]},${lut[k + 2]})`;
      g.fillRect(x, 0, 1, c.height);
    }
  }

  return {COLORS, scaleFor, cellsImage, hatch, paint, scaleBar};
})();
