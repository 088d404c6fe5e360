"""The SentencePiece BPE tokenizer against ``sentencepiece`` and Hugging Face ``tokenizers`` on the same text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassllm.sptokenizer import SPACE, SPTokenizer, load_sentencepiece_model
from glassllm.tokenizer import Tokenizer
from glassllm.tokenizing import TextTokenizer, tokenizer_from_json
from tests.support.glassllm_testing import need
from tests.support.llama_fixtures import hf_tokenizer_json, sp_training_text, train_sentencepiece


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """(glassllm's SPTokenizer, sentencepiece's processor, tokenizers' Tokenizer) for one trained model."""
    spm, tokenizers = need("sentencepiece"), need("tokenizers")
    need("transformers")                                                # writes the tokenizer.json
    folder = tmp_path_factory.mktemp("sp")
    model = train_sentencepiece(folder, vocab_size=512)
    hf = tokenizers.Tokenizer.from_file(str(hf_tokenizer_json(model, folder / "hf")))
    return load_sentencepiece_model(model), spm.SentencePieceProcessor(model_file=str(model)), hf


def _check_same(trio, text):
    ours, sp, hf = trio
    ids = ours.encode(text)
    assert ids == sp.encode(text)
    if not text.startswith(" "):
        # (transformers' Metaspace adds no dummy prefix to a text that starts with a space;
        # sentencepiece and glassllm do, so " a" starts with two ▁ there)
        assert ids == hf.encode(text, add_special_tokens=False).ids
        assert ours.encode_prompt(text) == hf.encode(text).ids          # <s> first, as the post-processor says
    return ids


def test_the_docstring_example_by_hand():
    """The module docstring's "Hi there", merged by hand with its five scored pieces."""
    pieces = [("<unk>", 0.0, "unknown"), ("<s>", 0.0, "control"), ("</s>", 0.0, "control")]
    pieces += [(p, 0.0, "normal") for p in (SPACE, "H", "i", "t", "h", "e", "r")]
    pieces += [("he", -1.0, "normal"), ("▁t", -2.0, "normal"), ("▁the", -3.0, "normal"),
               ("re", -4.0, "normal"), ("Hi", -9.0, "normal")]
    tok = SPTokenizer(pieces, byte_fallback=False)
    assert tok.pieces(tok.encode("Hi there")) == ["▁", "Hi", "▁the", "re"]
    assert tok.decode(tok.encode("Hi there")) == "Hi there"
    assert tok.encode_prompt("Hi there")[0] == 1
    assert tok.pieces(tok.encode("x")) == ["▁", "<unk>"]                  # no byte fallback: <unk>
    assert ("▁t", "he", "▁the") in tok.merges and tok.merges[0] == ("h", "e", "he")


def test_equals_sentencepiece_and_tokenizers_on_the_training_text(trio):
    text = sp_training_text()
    ids = _check_same(trio, text)
    assert trio[0].decode(ids) == text
    for line in text.splitlines()[:50]:
        assert trio[0].decode(_check_same(trio, line)) == line


def test_byte_fallback_for_unseen_characters(trio):
    ours = trio[0]
    ids = _check_same(trio, "a 😀 Ωμέγα\tتست\x00end")
    assert [ours.piece(i) for i in ids][2:6] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert ours.decode(ids) == "a 😀 Ωμέγα\tتست\x00end"


# Tiny models of a few letters, so that most characters are unknown to them: (training text, options).
_FEW_LETTERS = "\n".join(f"the cat sat on the mat and the dog ran to the {w} park"
                          for w in ("red", "big", "old", "sunny", "quiet") * 8)
_SMALL_MODELS = {
    "no byte fallback": (_FEW_LETTERS, dict(byte_fallback=False)),
    "no byte fallback, pieces across words": (_FEW_LETTERS, dict(byte_fallback=False, split_by_whitespace=False)),
    "no byte fallback, no piece for a space": ("\n".join(["thecatsatonthemat", "thedogranhome"] * 20),
                                                dict(byte_fallback=False, add_dummy_prefix=False)),
    "byte fallback": (_FEW_LETTERS, dict(byte_fallback=True)),
}
_UNKNOWN_RUNS = ["", "the\n\ncat", "日本語", "日本語 the cat", "the cat 日本語", "the 日本語 cat", "日 本 語",
                 "😀😀 hi 😀", "a\n\nb\n\nc", "<|im_start|>hi<|im_end|>", "\n\n\n", "  日本  ",
                 f"x{SPACE}日本", f"日{SPACE}本", "The CAT, the DOG!", "sunny?! 42 parks...", "the\tcat\r\nsat"]


@pytest.fixture(scope="module", params=list(_SMALL_MODELS))
def small(request, tmp_path_factory):
    """(glassllm's SPTokenizer, sentencepiece's processor) for a tiny model that lacks most characters."""
    spm = need("sentencepiece")
    text, options = _SMALL_MODELS[request.param]
    folder = tmp_path_factory.mktemp("small")
    (folder / "t.txt").write_text(text, encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / "t.txt"), model_prefix=str(folder / "m"), model_type="bpe",
                                   vocab_size=400 if options["byte_fallback"] else 60, hard_vocab_limit=False,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   character_coverage=1.0, minloglevel=2, num_threads=1, **options)
    return load_sentencepiece_model(folder / "m.model"), spm.SentencePieceProcessor(model_file=str(folder / "m.model"))


def _check_unknowns(small, text):
    ours, sp = small
    ids = ours.encode(text)
    assert ids == sp.encode(text)
    assert ours.decode(ids) == sp.decode(ids)
    if text.strip():                                                      # a story is read the same way
        assert ours.encode_corpus(text).tolist() == [sp.bos_id(), *sp.encode(text.strip())]
    if ours.byte_fallback:
        assert ours.decode(ids) == text.replace(SPACE, " ")
    return ids


def test_a_run_of_unknown_characters_is_one_unk(small):
    """Without byte fallback, sentencepiece gives one <unk> for each run of characters it cannot spell."""
    ours, sp = small
    for text in _UNKNOWN_RUNS:
        _check_unknowns(small, text)
    ids = ours.encode("the\n\ncat")
    if ours.byte_fallback:
        assert ours.pieces(ids).count("<0x0A>") == 2                       # each character its bytes, unmerged
    else:
        assert ids.count(sp.unk_id()) == 1 and ours.decode(ids) == sp.decode(ids) == "the \u2047 cat"


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="thecasdog \n\t日本😀<|>!", max_size=30))
def test_random_unknown_runs_equal_sentencepiece(small, text):
    _check_unknowns(small, text)


def test_equals_on_tinystories_held_out_text(trio, shared_data):
    path = shared_data / "tinystories" / "valid.txt"
    if not path.is_file():
        pytest.skip(f"needs ../shared: {path} is absent")
    text = path.read_text(encoding="utf-8")[:200_000]
    ids = _check_same(trio, text)
    assert trio[0].decode(ids) == text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=SPACE), max_size=40))
def test_random_unicode_equals_and_round_trips(trio, text):
    ids = _check_same(trio, text)
    assert trio[0].decode(ids) == text


def test_specials_and_end_ids(trio):
    ours = trio[0]
    assert ours.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2}
    assert ours.encode("<s>") != [1]                                      # text, as in sentencepiece
    assert ours.encode("<s>hi</s>", allowed_special="all")[0] == 1
    assert ours.encode_prompt("<s>hi") == ours.encode("<s>hi", allowed_special="all")  # no second <s>
    assert ours.end_ids == (2, 1) and ours.eot_id == 2 and ours.bos_id == 1
    ids = ours.encode_prompt("Once upon a time")
    assert ours.decode(ids) == "Once upon a time"                         # <s> decodes to nothing
    assert b"".join(ours.token_bytes(i, a) for a, i in zip(ids, ids[1:])) == b"Once upon a time"


def _with_specials(sp, parts):
    """The ids of ``parts``, each a text (sentencepiece's own encoding) or "<s>", "</s>", "<unk>" (its id)."""
    special = {"<s>": sp.bos_id(), "</s>": sp.eos_id(), "<unk>": sp.unk_id()}
    return [i for part in parts for i in ([special[part]] if part in special else sp.encode(part))]


# Control pieces at the start, in the middle and at the end; <unk> among them; pieces that are only a
# space, and byte pieces, right after a control piece.
_CONTROL_PLACES = [
    ["<s>", "Once upon", "<s>", "a time"], ["Once upon", "</s>", "a time"], ["</s>", "a time"],
    ["<s>", "</s>", "Once upon"], ["<s>", "Once upon", "</s>", "<s>", "a time", "</s>"], ["<s>", "<s>", "a"],
    ["Once", "<s>", "  a time"], ["<s>", "  Once"], ["Once upon", "</s>"], ["<s>"], ["</s>", "<s>"],
    ["<unk>", "Once"], ["<s>", "<unk>", "Once"], ["Once", "<s>", "<unk>", "a time"], ["</s>", "<unk>", "</s>"],
    ["<s>", "日本 a", "</s>", "😀 time", "<s>", "\nend"], ["Once", "<s>", "日"], ["<s>", "", "</s>", " x"],
]


def _check_control_places(ours, sp):
    for parts in _CONTROL_PLACES:
        ids = _with_specials(sp, parts)
        assert ours.decode(ids) == sp.decode(ids), (parts, sp.id_to_piece(ids))


def test_control_pieces_anywhere_decode_as_in_sentencepiece(trio):
    """The dummy prefix's space is taken back once, from the first piece that is not a control piece;
    control pieces later on change nothing, as in ``sentencepiece`` (whose decode is compared here)."""
    ours, sp = trio[:2]
    _check_control_places(ours, sp)
    assert ours.decode(_with_specials(sp, ["<s>", "Once upon", "<s>", "a time", "</s>"])) == "Once upon a time"
    assert ours.decode(_with_specials(sp, ["</s>", "<s>", "a time"])) == "a time"
    assert ours.decode_bytes(_with_specials(sp, ["Once", "</s>", "a"])) == b"Once a"


def test_control_pieces_in_tiny_models_decode_as_in_sentencepiece(small):
    """The same without byte fallback (<unk> for what the vocabulary cannot spell) and without the dummy prefix."""
    _check_control_places(*small)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet="thecasdog \n日😀", max_size=8),
                          st.sampled_from(["<s>", "</s>", "<unk>"])), max_size=8))
def test_random_control_pieces_decode_as_in_sentencepiece(small, parts):
    ours, sp = small
    ids = _with_specials(sp, parts)
    assert ours.decode(ids) == sp.decode(ids)


def test_merges_are_the_pairs_that_make_a_piece(trio):
    ours = trio[0]
    for a, b, piece in ours.merges:
        assert a + b == piece and ours.piece_type(ours.piece_id(piece)) == "normal"


def test_document_round_trip_and_kinds(trio, tmp_path):
    ours = trio[0]
    again = tokenizer_from_json(ours.to_json())
    assert isinstance(again, SPTokenizer) and isinstance(again, TextTokenizer)
    assert again.to_json() == ours.to_json()
    text = sp_training_text(20, seed=3)
    assert again.encode(text) == ours.encode(text)
    byte_level = Tokenizer.train(["aaabdaaabac"], vocab_size=261)
    doc = json.loads(byte_level.to_json())
    assert doc["kind"] == "byte-bpe"
    del doc["kind"]                                                       # a document written before kinds
    assert isinstance(tokenizer_from_json(json.dumps(doc)), Tokenizer)
    with pytest.raises(ValueError, match="kind 'wordpiece' is not supported"):
        tokenizer_from_json(json.dumps({**doc, "kind": "wordpiece"}))
    with pytest.raises(ValueError, match="vocab_size"):
        SPTokenizer.from_json(ours.to_json().replace('"vocab_size": 512', '"vocab_size": 511'))


def test_a_model_file_keeps_the_tokenizer(trio, tmp_path):
    from glassllm.checkpoint import load_model, save_model
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer

    ours = trio[0]
    model = Transformer(ModelConfig(vocab_size=512, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32,
                                    max_seq_len=32), seed=0)
    save_model(tmp_path / "m.safetensors", model, ours)
    _, tok, _ = load_model(tmp_path / "m.safetensors")
    assert isinstance(tok, SPTokenizer) and tok.to_json() == ours.to_json()


def test_encode_corpus_reads_stories_the_llama2c_way(trio, tmp_path, monkeypatch):
    import glassllm.tokenizers.corpus

    ours = trio[0]
    text = " once upon a time there was a cat\n<|endoftext|>\nthe cat sat on the mat and looked\n"
    ids = ours.encode_corpus(text)
    assert ids.dtype == np.uint16
    assert ids.tolist() == [1, *ours.encode("once upon a time there was a cat"),
                            1, *ours.encode("the cat sat on the mat and looked")]
    (tmp_path / "v.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(glassllm.tokenizers.corpus, "_BLOCK_CHARS", 8)           # stories run across blocks
    assert ours.encode_corpus(tmp_path / "v.txt").tolist() == ids.tolist()


def test_other_sentencepiece_models_are_refused(tmp_path):
    spm = need("sentencepiece")
    text = sp_training_text(200)
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "t.txt"), model_prefix=str(tmp_path / "uni"),
                                   model_type="unigram", vocab_size=150, minloglevel=2, num_threads=1)
    with pytest.raises(ValueError, match="model_type='unigram' is not supported; expected 'bpe'"):
        load_sentencepiece_model(tmp_path / "uni.model")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "t.txt"), model_prefix=str(tmp_path / "nfkc"),
                                   model_type="bpe", vocab_size=150, minloglevel=2, num_threads=1)
    with pytest.raises(ValueError, match="normalizer 'nmt_nfkc' is not supported"):
        load_sentencepiece_model(tmp_path / "nfkc.model")
    (tmp_path / "junk.model").write_bytes(b"\xff\xff\xff")
    with pytest.raises(ValueError, match="is not a SentencePiece model"):
        load_sentencepiece_model(tmp_path / "junk.model")


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="byte_fallback needs all 256 byte pieces"):
        SPTokenizer([("<unk>", 0.0, "unknown"), ("a", 0.0, "normal")])
    with pytest.raises(ValueError, match="expected distinct pieces"):
        SPTokenizer([("<unk>", 0.0, "unknown"), ("a", 0.0, "normal"), ("a", 0.0, "normal")],
                    add_bos=False, byte_fallback=False)
    tok = SPTokenizer([("<unk>", 0.0, "unknown"), ("a", 0.0, "normal")], add_bos=False, byte_fallback=False)
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([5])
    with pytest.raises(TypeError, match="encode expects a str"):
        tok.encode(b"a")


def test_generate_streams_the_text_and_stops_at_either_end_id(trio):
    from glassllm.config import ModelConfig
    from glassllm.generate import generate
    from glassllm.nn import Transformer
    from tests.support.glassllm_testing import randomize

    ours = trio[0]
    config = ModelConfig(vocab_size=512, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=64)
    model = randomize(Transformer(config, seed=0), np.random.default_rng(2))
    prompt = "Once upon a time"
    records = list(generate(model, ours, prompt, max_new_tokens=30, temperature=1.0, seed=3))
    ids = [t.id for t in records if t.finish != "eot"]
    start = ours.encode_prompt(prompt)
    assert records[0].n == len(start) and start[0] == 1
    assert "".join(t.text for t in records) == ours.decode(start + ids)[len(prompt):]
    for end in (2, 1):                                                  # </s>, and <s> as run.c stops
        # Layers that add nothing, and an output row that points along the last prompt token's embedding:
        # that id's logit is 100 |x|^2 / rms(x), far above the others.
        state = {k: (np.zeros_like(v) if k.endswith(("attention.wo.weight", "feed_forward.w2.weight")) else v.copy())
                 for k, v in model.state_dict().items()}
        state["norm.weight"][:] = 1
        state["output.weight"][end] = 100 * state["tok_embeddings.weight"][start[-1]]
        forced = Transformer(config, seed=0)
        forced.load_state_dict(state)
        (only,) = list(generate(forced, ours, prompt, max_new_tokens=5, temperature=0))
        assert (only.id, only.finish, only.text) == (end, "eot", "")


def test_tokenize_command_reads_a_sentencepiece_tokenizer_file(trio, tmp_path, capsys):
    from glassllm import cli

    trio[0].save(tmp_path / "sp.json")
    assert cli.main(["tokenize", "--tokenizer", str(tmp_path / "sp.json"), "the cat 😀"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("'")[1] for line in out[:-1]] == trio[0].pieces(trio[0].encode("the cat 😀"))


@pytest.fixture(scope="module")
def hf_doc(tmp_path_factory):
    need("sentencepiece"), need("transformers")
    folder = tmp_path_factory.mktemp("hfdoc")
    model = train_sentencepiece(folder, vocab_size=512)
    return json.loads(hf_tokenizer_json(model, folder / "hf").read_text(encoding="utf-8"))


def test_tokenizer_json_in_both_spellings_reads_as_sentencepiece(trio, hf_doc):
    """The Metaspace form transformers writes today, and the older Prepend + Replace normaliser."""
    ours = trio[0]
    legacy = {**hf_doc, "pre_tokenizer": None, "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": SPACE}, {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}}
    tokenizers = need("tokenizers")
    text = sp_training_text(30, seed=7) + " ünseen 😀 text"
    for doc in (hf_doc, legacy):
        mine = SPTokenizer.from_hf_tokenizer_json(doc)
        theirs = tokenizers.Tokenizer.from_str(json.dumps(doc))
        assert mine.encode(text) == ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids
        assert mine.encode_prompt(text) == theirs.encode(text).ids
        assert mine.add_bos and mine.byte_fallback and mine.vocab_size == ours.vocab_size


def test_tokenizer_json_that_is_not_sentencepiece_bpe_is_refused(hf_doc):
    import copy

    missing = copy.deepcopy(hf_doc)
    a, b = missing["model"]["merges"].pop(3)
    with pytest.raises(ValueError, match=f"model.merges='{a} {b}' is not supported; expected every pair"):
        SPTokenizer.from_hf_tokenizer_json(missing)
    eos_after = copy.deepcopy(hf_doc)
    eos_after["post_processor"]["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}})
    with pytest.raises(ValueError, match="post_processor.single"):
        SPTokenizer.from_hf_tokenizer_json(eos_after)
