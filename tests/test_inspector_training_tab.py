"""The Training tab: the learning rate it shows at each step, and its layout in a narrow window.

- the learning rate of every recorded step, in the timeline's answer and on the page at steps 1, 2 and
  later, is the rate of the optimiser step that led to that model: the training history's at the same
  step, the schedule's own value of the step before (:func:`glassllm.optim.lr_at`, whose steps count
  from 0), and by hand from the run's warm-up for the first steps; step 0, before any step, has none;
- at a window 800 px wide, and at 1280 px, nothing in the tab runs past its card, and the next-token
  guess stays readable: every bar's track at least 80 px wide, each column heading on one line, and the
  piece, the track and p of a row side by side without overlapping.

The run is ``test_inspector_timeline``'s tiny one (24 steps, warm-up 2, peak 0.01); Chromium and its
``GLASSLLM_REQUIRE_BROWSER`` rule come from ``test_inspector_browser``.
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from tests.test_inspector_browser import browser, idle  # noqa: E402, F401

from glassllm.optim import lr_at  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The tiny run's (model, tokenizer, meta, timeline), and its schedule as a function of the step."""
    from tests.test_inspector_timeline import tiny_run

    from glassllm.commands.inspect import load_inspected

    folder = tmp_path_factory.mktemp("training-tab")
    tiny_run(folder)
    model, tokenizer, meta, timeline = load_inspected(None, str(folder / "run"))
    c = json.loads(meta["train_config"])
    assert (c["lr"], c["warmup_steps"], c["steps"]) == (0.01, 2, 24)              # tiny_run's command

    def schedule(step):
        return lr_at(step, c["lr"], c["warmup_steps"], c["steps"], c["min_lr"])

    return model, tokenizer, meta, timeline, schedule


@pytest.fixture(scope="module")
def server(run):
    from glassllm.inspector import Inspector, create_app
    from glassllm.inspector.server import Server

    model, tokenizer, meta, timeline, _ = run
    s = Server(create_app(Inspector(model, tokenizer, meta=meta, timeline=timeline), prompt="Once upon a time",
                          tab="training"), "127.0.0.1", 0).start()
    yield s
    s.stop()


def training_page(browser, server, width):  # noqa: F811
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url)
    page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
    idle(page)
    page.wait_for_selector("#tl-next li.bar")
    return page, errors


def show_step(page, s: int) -> str:
    page.fill("#tl-slider", str(s))
    page.dispatch_event("#tl-slider", "input")
    return page.inner_text("#tl-row")


def test_each_steps_learning_rate_is_the_one_of_the_step_that_led_to_it(run):
    from fastapi.testclient import TestClient

    from glassllm.inspector import Inspector, create_app

    model, tokenizer, meta, timeline, schedule = run
    client = TestClient(create_app(Inspector(model, tokenizer, timeline=timeline)), base_url="http://127.0.0.1")
    rows = client.post("/api/timeline", content="{}", headers={"Content-Type": "application/json"}).json()["rows"]
    assert [r["step"] for r in rows[:3]] == [0, 1, 2]
    # By hand: a linear warm-up over 2 steps to the peak, lr_at(k) = 0.01 * (k + 1) / 2, then the cosine from
    # it; the step that led to model 1 was step 0 of the schedule.
    assert rows[0]["lr"] is None
    assert [r["lr"] for r in rows[1:3]] == pytest.approx([0.005, 0.01], rel=1e-12)
    history = {h["step"]: h["lr"] for h in timeline.history}           # the rates the trainer stepped with
    for r in rows[1:]:
        assert r["lr"] == pytest.approx(schedule(r["step"] - 1), rel=1e-12), r["step"]
        assert r["lr"] == history[r["step"]], r["step"]


def test_the_page_shows_each_steps_learning_rate_from_the_schedule(browser, server, run):  # noqa: F811
    timeline, schedule = run[3], run[4]
    page, errors = training_page(browser, server, 1280)
    try:
        text = show_step(page, 0)
        assert "step 0 ·" in text and "no step yet" in text and "lr " not in text
        for s in (1, 2, len(timeline.steps) // 2, len(timeline.steps) - 1):
            step = timeline.steps[s]
            text = show_step(page, s)
            assert f"step {step:,} ·" in text
            shown = float(re.search(r"\blr ([0-9.e+-]+)", text).group(1))
            assert shown == pytest.approx(schedule(step - 1), rel=1e-3), (step, text)  # 4 digits on the page
        assert errors == []
    finally:
        page.close()


# What the layout test measures: the panel's overflow, every element that runs past the panel's sides, and the
# boxes of the next-token guess (the list, its heading row and each bar's piece, track and p).
MEASURE = """() => {
  const panel = document.getElementById("panel-training"), p = panel.getBoundingClientRect();
  const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width,
                                                                     height: r.height}; };
  const past = Array.from(panel.querySelectorAll("*")).filter((e) => {
    const r = e.getBoundingClientRect();
    return r.width > 0 && (r.left < p.left - 0.5 || r.right > p.right + 0.5);
  }).map((e) => e.id || e.className || e.tagName);
  const list = document.getElementById("tl-next");
  return {overflow: panel.scrollWidth - panel.clientWidth, past, list: box(list),
          headings: Array.from(list.querySelectorAll("li.cols > span")).map(box),
          rows: Array.from(list.querySelectorAll("li.bar")).map((li) => Array.from(li.children).map(box)),
          tracks: Array.from(list.querySelectorAll("li.bar .track")).map(box),
          line: parseFloat(getComputedStyle(list.querySelector("li.cols")).lineHeight)};
}"""


@pytest.mark.parametrize("width", [800, 1280])
def test_the_training_tab_is_readable_in_a_narrow_window(browser, server, run, width):  # noqa: F811
    timeline = run[3]
    page, errors = training_page(browser, server, width)
    try:
        for s in (0, len(timeline.steps) - 1):
            show_step(page, s)
            m = page.evaluate(MEASURE)
            assert m["overflow"] <= 0 and m["past"] == [], m                   # nothing runs past the card
            assert len(m["tracks"]) == 5 and min(t["width"] for t in m["tracks"]) >= 80, m["tracks"]
            assert all(h["height"] <= 1.5 * m["line"] for h in m["headings"]), m["headings"]   # one line each
            for cells in m["rows"]:                                            # piece | track | p, apart
                assert len(cells) == 3
                assert m["list"]["left"] - 0.5 <= cells[0]["left"] and cells[-1]["right"] <= m["list"]["right"] + 0.5
                assert all(a["right"] <= b["left"] + 0.5 for a, b in zip(cells, cells[1:])), cells
        assert errors == []
    finally:
        page.close()
