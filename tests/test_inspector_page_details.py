"""Small things the inspector's page must get right, in Chromium (Playwright), each found by a QA pass:

- the step-through follows the Head buttons (a query head, and the key/value head it reads);
- the offline export says why a number cannot be set there, and keeps saying it after a cell is picked;
- a refused All-heads view leaves no title describing the previous one;
- the Intervene card shows the picked float32 number as the readout does (shortest digits), not as float64;
- the logit lens's PNG shows its cells as the page does (␣ for spaces, 2-decimal probabilities);
- a logit lens wider than its card opens scrolled to its last position;
- the headings count in words that fit: one query, one key; no keys for a view without a key axis.

Fixtures (Chromium, the model, the live server) come from ``test_inspector_browser``.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.test_inspector_browser import browser, idle, inspector, opened, parts, server, traced  # noqa: F401

pytestmark = pytest.mark.browser

PROMPT = "Once upon a time"   # the server fixture's opening prompt
OFFLINE_EDIT = "setting a number needs a new forward pass: run glassllm inspect"


@pytest.fixture(scope="module")
def exported(inspector, tmp_path_factory):                                # noqa: F811
    """An offline export of PROMPT (no decoding steps: a small file)."""
    from glassllm.inspector import export_html

    path = tmp_path_factory.mktemp("export") / "page.html"
    export_html(inspector, PROMPT, path, steps=0)
    return path.as_uri()


def _walk_to(page, name: str) -> None:
    """Step through to snapshot ``name`` (a full name), as Next would."""
    page.evaluate("""async (name) => { for (let i = 0; ; i++) {
        await window.glass.walkTo(i); await window.glass.idle();
        if (window.glass.walk.name === name || window.glass.walk.index < i) return; } }""", name)
    assert page.evaluate("() => window.glass.walk.name") == name


def test_the_step_through_follows_the_head_buttons(browser, server, parts):  # noqa: F811
    model, tokenizer = parts[0], parts[1]
    ref = traced(model, tokenizer.encode(PROMPT, allowed_special="all"))
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 0, head: 0}")
    page.click("#tabs button[data-tab='walk']")
    idle(page)
    _walk_to(page, "layers.0.attn.head_out")
    assert page.evaluate("() => window.glass.walk.head") == 0
    page.click("#heads button[data-head='2']")
    idle(page)
    w = page.evaluate("() => window.glass.walk")
    assert w["head"] == 2 and page.inner_text("#walk-name") == "layers.0.attn.head_out · query head 2"
    np.testing.assert_array_equal(np.array(w["row"], dtype=np.float32),
                                  ref.get("attn.head_out", layer=0, head=2)[w["rowIndex"]])
    # At a key/value snapshot, a query head's button shows the key/value head that query head reads.
    _walk_to(page, "layers.0.attn.k")
    page.click("#heads button[data-head='3']")
    idle(page)
    rep = model.config.n_heads // model.config.n_kv_heads
    w = page.evaluate("() => window.glass.walk")
    assert w["head"] == 3 // rep and page.inner_text("#walk-name") == f"layers.0.attn.k · key/value head {3 // rep}"
    np.testing.assert_array_equal(np.array(w["row"], dtype=np.float32),
                                  ref.get("attn.k", layer=0, head=3 // rep)[w["rowIndex"]])
    page.close()


def test_the_offline_export_says_why_a_number_cannot_be_set(browser, exported):
    page = opened(browser, exported, "{name: 'attn.softmax', layer: 0, head: 1}")
    at = page.evaluate("() => window.glass.heatmap.cellCenter(2, 0)")
    page.locator("#heatmap").click(position=at)                          # a picked cell: the button names it
    assert page.inner_text("#edit-cell") == "Edit cell (2, 0)" and page.is_disabled("#edit-cell")
    assert page.get_attribute("#edit-cell", "title") == OFFLINE_EDIT
    assert page.is_disabled("input[name=iv][value=edit]")
    assert page.evaluate("() => document.querySelector('input[name=iv][value=edit]').parentElement.title") == OFFLINE_EDIT
    page.close()


def test_a_refused_all_heads_view_leaves_no_title_of_the_previous_one(browser, exported):
    page = opened(browser, exported)
    page.check("input[name=iv][value=ablate]")
    page.select_option("#iv-layer", "1")
    page.select_option("#iv-head", "2")
    idle(page)
    page.click("#tabs button[data-tab='heads']")
    idle(page)
    assert page.is_hidden("#grid-error") and "ablated" in page.inner_text("#grid-title")   # this one is exported
    page.click("#showwhat button[data-grad='1']")                        # its gradient is not
    idle(page)
    assert page.is_visible("#grid-error") and page.locator("#head-grid .thumb").count() == 0
    assert page.inner_text("#grid-title") == "" and page.inner_text("#grid-legend-note") == ""
    page.close()


def test_the_intervene_card_shows_the_picked_float32_in_its_shortest_digits(browser, server, parts):  # noqa: F811
    model, tokenizer = parts[0], parts[1]
    want = traced(model, tokenizer.encode(PROMPT, allowed_special="all")).get("attn.softmax", layer=0, head=1)[2, 0]
    assert want.dtype == np.float32
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 0, head: 1}")
    page.locator("#heatmap").click(position=page.evaluate("() => window.glass.heatmap.cellCenter(2, 0)"))
    shown = page.inner_text("#readout").rsplit(": ", 1)[1]
    assert shown == str(want)                                             # numpy's shortest float32 digits
    page.keyboard.press("e")
    page.wait_for_function("() => document.activeElement.id === 'iv-value'")
    idle(page)
    assert page.input_value("#iv-value") == shown
    assert page.inner_text("#iv-cell").endswith(f"was {shown}")
    assert f"set to {shown}." in page.inner_text("#iv-summary")
    # The same bits: the edit applied at once moves nothing.
    assert page.evaluate("() => window.glass.heatmap.value(2, 0)") == float(want)
    assert float(page.get_attribute("#iv-summary", "data-maxdiff")) == 0.0
    page.close()


def test_the_logit_lens_png_shows_the_cells_as_the_page_does(browser, server):  # noqa: F811
    page = opened(browser, server.url)
    page_cells = page.evaluate("""() => [...document.querySelectorAll('#lens tr')].map(tr => [...tr.children].map(c =>
        c.firstChild.textContent + (c.querySelector('small') ? ' ' + c.querySelector('small').textContent : '')))""")
    saved = page.evaluate("() => window.glass.save('lens', 'png')")
    lines = [line.split("\t") for line in saved["text"].splitlines()]
    assert [row[1:] for row in lines] == [row[1:] for row in page_cells]   # past the row names: as on the page
    assert any("␣" in cell for row in lines for cell in row)               # a leading space, shown
    page.close()


def test_a_wide_logit_lens_opens_at_its_last_position(browser, server):  # noqa: F811
    page = opened(browser, server.url)
    page.set_viewport_size({"width": 800, "height": 900})
    page.evaluate("() => window.glass.run('Once upon a time there was a little dog who liked to run and play in "
                  "the park with his red ball every day')")
    idle(page)
    box = page.evaluate("""() => { const w = document.querySelector('.lens-wrap'), r = w.getBoundingClientRect(),
        last = document.querySelector('#lens tr th:last-child').getBoundingClientRect(),
        stream = document.querySelector('#lens tr:nth-child(2) th').getBoundingClientRect();
        return {scroll: w.scrollLeft, width: w.clientWidth, whole: w.scrollWidth, right: r.right,
                lastLeft: last.left, lastRight: last.right, streamLeft: stream.left, left: r.left}; }""")
    assert box["whole"] > box["width"]                                    # wider than its card: it scrolls
    assert box["scroll"] + box["width"] >= box["whole"] - 1               # ... from its right end
    assert box["lastLeft"] >= box["right"] - box["width"] and box["lastRight"] <= box["right"] + 1
    assert abs(box["streamLeft"] - box["left"]) <= 1                      # the stream names stay in sight
    page.evaluate("() => { document.querySelector('.lens-wrap').scrollLeft = 0; }")
    assert page.evaluate("() => document.querySelector('.lens-wrap').scrollLeft") == 0
    page.close()


def test_the_headings_count_queries_keys_and_positions_in_fitting_words(browser, server, parts):  # noqa: F811
    tokenizer = parts[1]
    assert len(tokenizer.encode("Once", allowed_special="all")) == 1
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 0, head: 0}")
    page.evaluate("() => window.glass.run('Once')")
    idle(page)
    assert page.inner_text("#view-shape").endswith("prompt pass: n = 1 query, m = 1 key")
    assert page.inner_text("#step-line").startswith("step 0: the prompt, n = 1 query, m = 1 key, nothing cached yet")
    n = len(tokenizer.encode(PROMPT, allowed_special="all"))
    page.evaluate(f"() => window.glass.run({PROMPT!r})")
    idle(page)
    assert page.inner_text("#view-shape").endswith(f"prompt pass: n = {n} queries, m = {n} keys")
    for name in ["logits", "probs"]:                                      # no key axis: positions, no keys
        page.evaluate(f"() => window.glass.select({{name: '{name}'}})")
        idle(page)
        assert page.inner_text("#view-shape") == f"shape (n = {n}, V = {parts[0].config.vocab_size}) · " \
                                                 f"prompt pass: n = {n} positions"
    page.evaluate("() => window.glass.step()")
    idle(page)
    assert page.inner_text("#view-shape").endswith(f"decoding step 1: n = 1 new position, after {n} cached")
    page.close()
