"""Byte-level tokenizer.json layouts of real small Llamas (GPT-2's ByteLevel regex, SmolLM2's Digits then
ByteLevel), read by glassllm and compared with the ``tokenizers`` package that wrote them.

Each tokenizer is trained here with ``tokenizers`` (no download); glassllm reads its JSON and must cut the
text into the same pieces and give the same ids (through the import's renumbering) on text with digits,
Unicode, runs of spaces and newlines.
"""

from __future__ import annotations

import json
import re

import pytest

from glassllm.tokenizers.hfjson import bytes_to_unicode, tokenizer_from_hf

TRAIN = ("The year 2024 had 365 days; in 1999, 42 cats ate 7 fish.\n  Indented   lines\n\n\tand tabs. "
         "Café naïve résumé — “quotes” 日本語 テキスト Ⅻ ½ ٣ 😀 don't we'll it's. ") * 20
TEXTS = [
    "Call 555-0199 or 1234567890 at 3:45pm, 12.5% of 1,000,000.",
    "a  b   c    d\n\n\n  e\t\t f \r\n g   ",
    "x1 y22 z333 4w 5 6  7   8",
    "Café ½ ² ٣٤ Ⅻ 日本語のテキスト 한국어 العربية हिन्दी 😀👍🏽 ñ\u0303 e\u0301",
    "he's they're I'm we'll you've she'd it'S DON'T",
    "   leading spaces and trailing   ",
    "\n\nnew\nlines\n\n",
    "tabs\tand\u00a0nbsp\u2003em\u3000ideographic",
    "!!! ??? ... --- ((( ))) \"\" '' `` 9!9?9",
]


def _trained(layout: str):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if layout == "gpt2":
        tok.pre_tokenizer = byte_level
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=layout == "digits"), byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAIN], trainer)
    return tok


@pytest.mark.parametrize("layout", ["gpt2", "digits", "digit_runs"])
def test_byte_level_layouts_cut_and_encode_as_tokenizers_does(layout):
    hf_tok = _trained(layout)
    doc = json.loads(hf_tok.to_str())
    ours, perm = tokenizer_from_hf(doc)
    unicode_to_byte = {c: b for b, c in bytes_to_unicode().items()}   # to read tokenizers' pieces back
    for text in TEXTS + [TRAIN[:300]]:
        pieces = [p for p, _ in hf_tok.pre_tokenizer.pre_tokenize_str(text)]
        theirs = [bytes(unicode_to_byte[c] for c in p).decode("utf-8") for p in pieces]
        assert re.findall(ours.pattern, text) == theirs, text
        assert [int(perm[i]) for i in ours.encode(text)] == hf_tok.encode(text).ids, text
        assert ours.decode(ours.encode(text)) == text


@pytest.mark.parametrize("pre, words", [
    ({"type": "Whitespace"}, "pre_tokenizer='Whitespace'"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                            {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}]},
     "add_prefix_space=True"),
    ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}, "use_regex=False"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Punctuation"}, {"type": "ByteLevel"}]},
     "pre_tokenizer=\\['Punctuation', 'ByteLevel'\\]"),
])
def test_other_layouts_are_refused_in_one_line(pre, words):
    doc = json.loads(_trained("gpt2").to_str())
    doc["pre_tokenizer"] = pre
    with pytest.raises(ValueError, match=words) as e:
        tokenizer_from_hf(doc)
    assert "\n" not in str(e.value)
