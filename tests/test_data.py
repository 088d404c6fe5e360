"""Token cache, random windows and the hub fetcher (against a stand-in hub on loopback)."""

from __future__ import annotations

import doctest
import hashlib
import http.server
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from glassllm import data
from glassllm.data import (HUB_SOURCES, WindowSampler, expand_paths, fetch_hub_file, hub_url, resolve_sources,
                           token_ids)
from glassllm.tokenizer import Tokenizer


def make_stories(n: int, seed: int) -> str:
    """Small story-like text in the shared files' layout (stories end with an <|endoftext|> line)."""
    rng = np.random.default_rng(seed)
    names, things = ["Tom", "Lily", "Ben", "Mia"], ["ball", "cat", "tree", "boat", "cake"]
    stories = []
    for _ in range(n):
        a, b = rng.choice(names, 2, replace=False)
        t = rng.choice(things)
        stories.append(f"Once upon a time, {a} had a {t}.\n{a} gave the {t} to {b}. {b} was happy.")
    return "".join(s + "\n<|endoftext|>\n" for s in stories)


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(make_stories(30, 0), encoding="utf-8")
    (folder / "sub" / "b.txt").write_text(make_stories(20, 1), encoding="utf-8")
    (folder / "notes.md").write_text("not training text", encoding="utf-8")
    (folder / ".hidden.txt").write_text("skipped", encoding="utf-8")
    return folder


def test_doctests():
    assert doctest.testmod(data).failed == 0


def test_expand_paths_folders_and_files(corpus):
    assert expand_paths(corpus) == [corpus / "a.txt", corpus / "sub" / "b.txt"]
    assert expand_paths([corpus / "notes.md", corpus / "a.txt"]) == [corpus / "notes.md", corpus / "a.txt"]
    with pytest.raises(ValueError, match="does not exist"):
        expand_paths(corpus / "nope.txt")
    (corpus / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .txt files"):
        expand_paths(corpus / "empty")


def test_a_data_path_that_is_neither_file_nor_folder_is_named(tmp_path):
    specials = [p for p in ["/dev/null"] if Path(p).exists()]
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.txt")
        specials.append(str(tmp_path / "pipe.txt"))
    if not specials:
        pytest.skip("no device or FIFO here")
    for special in specials:
        with pytest.raises(ValueError) as e:
            expand_paths(special)
        assert str(e.value) == (f"data path {special!r} is not a regular file or folder (a device, a pipe or a "
                                "socket): expected a text file or a folder of .txt files")


def test_token_cache_is_the_tokenizer_output_and_is_reused(corpus, tmp_path):
    tok = Tokenizer.train([corpus / "a.txt"], vocab_size=300)
    files = expand_paths(corpus)
    ids = token_ids(files, tok, tmp_path / "cache")
    assert isinstance(ids, np.memmap) and ids.dtype == np.uint16
    expected = tok.encode_corpus(files)
    assert np.array_equal(ids, expected)
    # The ids decode back to the files' bytes, with the end-of-text id between stories.
    assert tok.decode_bytes(np.asarray(ids, dtype=np.int64)) == b"".join(f.read_bytes() for f in files)
    assert int((np.asarray(ids) == tok.eot_id).sum()) == 50
    cached = list((tmp_path / "cache").glob("tokens-*.npy"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    again = token_ids(files, tok, tmp_path / "cache")
    assert np.array_equal(again, ids) and cached[0].stat().st_mtime_ns == stamp   # read, not rewritten
    # Changing a file, or the tokenizer, gives a new cache entry.
    (corpus / "a.txt").write_text(make_stories(31, 0), encoding="utf-8")
    token_ids(files, tok, tmp_path / "cache")
    token_ids(files, Tokenizer.train([corpus / "a.txt"], vocab_size=290), tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("tokens-*.npy"))) == 3


def test_windows_are_consecutive_slices():
    ids = np.arange(1000, dtype=np.uint16) * 7 % 1009
    ids = ids.astype(np.uint16)
    s = WindowSampler(ids, seq_len=16, batch_size=5, rng=np.random.default_rng(42))
    x, y = s.next_batch()
    assert x.shape == y.shape == (5, 16) and x.dtype == np.int64
    starts = np.random.default_rng(42).integers(0, 1000 - 16, size=5)   # the documented draw
    for b, st in enumerate(starts):
        assert np.array_equal(x[b], ids[st:st + 16]) and np.array_equal(y[b], ids[st + 1:st + 17])


def test_windows_reach_both_ends_and_never_overrun():
    ids = np.arange(12, dtype=np.uint16)
    s = WindowSampler(ids, seq_len=4, batch_size=64, rng=np.random.default_rng(0))
    seen_first, seen_last = set(), set()
    for _ in range(20):
        x, y = s.next_batch()
        seen_first.update(x[:, 0].tolist())
        seen_last.update(y[:, -1].tolist())
    assert seen_first == set(range(8)) and max(seen_last) == 11


def test_sampler_state_round_trips_through_json():
    ids = np.arange(500, dtype=np.uint16)
    a = WindowSampler(ids, 8, 4, np.random.default_rng(7))
    for _ in range(3):
        a.next_batch()
    saved = json.loads(json.dumps(a.state()))
    expected = [a.next_batch() for _ in range(3)]
    b = WindowSampler(ids, 8, 4, np.random.default_rng(999))
    b.set_state(saved)
    assert b.batches == 3
    for (x1, y1), (x2, y2) in zip(expected, (b.next_batch() for _ in range(3))):
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


@pytest.mark.parametrize("kind", ["text", "random"])
@pytest.mark.parametrize("seq_len", [8, 9, 16, 255])
def test_repeated_windows_repeat_a_span(seq_len, kind):
    ids = (np.arange(3000) * 7919 % 1021).astype(np.uint16)      # no short cycles: a repeat is a real repeat
    B = 400
    s = WindowSampler(ids, seq_len, B, np.random.default_rng(3), repeat_fraction=0.25, repeat_tokens=kind)
    x, y = s.next_batch()
    rows = np.concatenate([x, y[:, -1:]], axis=1)                # (B, T+1), the sampled text
    assert np.all(y[:, :-1] == x[:, 1:])                         # targets stay the next token
    # The documented draws: B starts, B uniforms, B periods between ceil((T+1)/8) and ceil((T+1)/2),
    # and for "random" B x (T+1) positions of which each row uses its first h.
    rng = np.random.default_rng(3)
    starts = rng.integers(0, len(ids) - seq_len, size=B)
    repeat = rng.random(B) < 0.25
    period = rng.integers(-(-(seq_len + 1) // 8), -(-(seq_len + 1) // 2) + 1, size=B)
    types = np.unique(ids)                                       # the ids that occur, sorted
    drawn = types[rng.integers(0, len(types), size=(B, seq_len + 1))] if kind == "random" else None
    for b, (row, st, rep, h) in enumerate(zip(rows, starts, repeat, period)):
        if rep:                                                  # one span of h tokens, over and over
            span = ids[st:st + h] if kind == "text" else drawn[b, :h]
            expected = np.concatenate([span] * (seq_len // h + 1))[:seq_len + 1]
        else:
            expected = ids[st:st + seq_len + 1]
        assert np.array_equal(row, expected)
    assert 0.15 < repeat.mean() < 0.35 and len(set(period[repeat].tolist())) > 1


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_a_batch_of_another_shape_comes_from_the_same_stream(fraction):
    """next_batch(T, B) draws what a sampler built for (T, B) would, and the stream goes on."""
    ids = (np.arange(3000) * 7919 % 1021).astype(np.uint16)
    a = WindowSampler(ids, 32, 4, np.random.default_rng(5), fraction, "random")
    short = WindowSampler(ids, 8, 16, np.random.default_rng(5), fraction, "random")
    for _ in range(2):
        assert all(np.array_equal(u, v) for u, v in zip(a.next_batch(8, 16), short.next_batch()))
    assert a.rng.bit_generator.state == short.rng.bit_generator.state and a.batches == 2
    x, y = a.next_batch()
    assert x.shape == y.shape == (4, 32)
    long = WindowSampler(ids, 32, 4, np.random.default_rng(0), fraction, "random")
    long.rng.bit_generator.state = short.rng.bit_generator.state
    assert np.array_equal(long.next_batch()[0], x)
    with pytest.raises(ValueError, match="cannot draw 4 windows of 3000 tokens from 3000 tokens"):
        a.next_batch(3000, 4)


def test_repeat_fraction_zero_draws_the_same_windows_as_before():
    ids = np.arange(500, dtype=np.uint16)
    a = WindowSampler(ids, 8, 4, np.random.default_rng(7))
    b = WindowSampler(ids, 8, 4, np.random.default_rng(7), repeat_fraction=0.0)
    for _ in range(3):
        assert all(np.array_equal(u, v) for u, v in zip(a.next_batch(), b.next_batch()))
    with pytest.raises(ValueError, match="repeat_fraction must be between 0 and 1, got 1.5"):
        WindowSampler(ids, 8, 4, np.random.default_rng(7), repeat_fraction=1.5)
    with pytest.raises(ValueError, match="repeat_tokens must be one of text, random, got 'noise'"):
        WindowSampler(ids, 8, 4, np.random.default_rng(7), repeat_fraction=0.5, repeat_tokens="noise")


def test_sampler_rejects_short_data_and_bad_rng():
    with pytest.raises(ValueError, match="fewer than one window"):
        WindowSampler(np.arange(8, dtype=np.uint16), 8, 1, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        WindowSampler(np.arange(80, dtype=np.uint16), 8, 1, 0)
    with pytest.raises(ValueError, match="sampler state"):
        WindowSampler(np.arange(80, dtype=np.uint16), 8, 1, np.random.default_rng(0)).set_state({})


# ----------------------------------------------------------------------------
# The hub, on loopback
# ----------------------------------------------------------------------------

class _Hub:
    """Serves files under the hub's layout; /resolve/ redirects to /cdn/ like the real hub.

    ``files`` maps "owner/name/revision/filename" to bytes; ``etag_override``
    lets a test send a wrong SHA-256.
    """

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.etag_override: str | None = None
        self.requests: list[str] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.requests.append(self.path)
                parts = self.path.split("/")
                # /datasets/{owner}/{name}/resolve/{revision}/{filename}
                if len(parts) == 7 and parts[1] == "datasets" and parts[4] == "resolve":
                    key = "/".join([parts[2], parts[3], parts[5], parts[6]])
                    if key not in hub.files:
                        self.send_error(404, "Entry not found")
                        return
                    self.send_response(302)
                    self.send_header("Location", "/cdn/" + key)
                    self.send_header("X-Linked-Etag", '"' + hashlib.sha256(hub.files[key]).hexdigest() + '"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path.startswith("/cdn/") and self.path[5:] in hub.files:
                    body = hub.files[self.path[5:]]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("ETag", '"' + (hub.etag_override or hashlib.sha256(body).hexdigest()) + '"')
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_hub_url_layout():
    assert hub_url("roneneldan/TinyStories", "TinyStories-valid.txt", endpoint="https://example.org/") == \
        "https://example.org/datasets/roneneldan/TinyStories/resolve/main/TinyStories-valid.txt"


def test_fetch_tinystories_from_a_local_hub(tmp_path):
    text = make_stories(40, 3).encode("utf-8")
    repo, filename = HUB_SOURCES["tinystories:valid"]
    with _Hub() as hub:
        hub.files[f"{repo}/main/{filename}"] = text
        files = resolve_sources(["tinystories:valid"], cache_dir=tmp_path, endpoint=hub.endpoint, progress=False)
        assert len(files) == 1 and files[0].read_bytes() == text
        assert files[0] == tmp_path / "hub" / "datasets--roneneldan--TinyStories" / "main" / filename
        assert hub.requests == [f"/datasets/{repo}/resolve/main/{filename}", f"/cdn/{repo}/main/{filename}"]
        # A second request is served from disk.
        resolve_sources(["tinystories:valid"], cache_dir=tmp_path, endpoint=hub.endpoint, progress=False)
        assert len(hub.requests) == 2
        # Generic hf: sources work the same way.
        hub.files["someone/stories/main/part.txt"] = b"hello\n<|endoftext|>\n"
        (path,) = resolve_sources(["hf:someone/stories/part.txt"], cache_dir=tmp_path,
                                  endpoint=hub.endpoint, progress=False)
        assert path.read_bytes() == b"hello\n<|endoftext|>\n"
    # What was fetched trains and tokenises like any local file.
    tok = Tokenizer.train(files, vocab_size=280)
    assert tok.decode_bytes(tok.encode_corpus(files).astype(np.int64)) == text


def test_fetch_refuses_corrupt_or_missing_files(tmp_path):
    with _Hub() as hub:
        hub.files["o/n/main/a.txt"] = b"some text\n"
        hub.etag_override = "0" * 64
        with pytest.raises(ValueError, match="corrupt"):
            fetch_hub_file("o/n", "a.txt", tmp_path, endpoint=hub.endpoint, progress=False)
        assert not (tmp_path / "datasets--o--n" / "main" / "a.txt").exists()      # nothing half-written
        assert not list((tmp_path / "datasets--o--n" / "main").iterdir())
        with pytest.raises(ValueError, match="HTTP 404"):
            fetch_hub_file("o/n", "missing.txt", tmp_path, endpoint=hub.endpoint, progress=False)
    with pytest.raises(ValueError, match="cannot download"):
        fetch_hub_file("o/n", "a.txt", tmp_path, endpoint=hub.endpoint, timeout=5, progress=False)


def test_shared_tinystories_layout(shared_data):
    """The developers' subset: stories separated by <|endoftext|> lines, as the fetcher's files are."""
    text = (shared_data / "tinystories" / "valid.txt").read_text(encoding="utf-8")
    assert text.endswith("\n<|endoftext|>\n")
    assert text.count("\n<|endoftext|>\n") == 1000


def test_a_file_whose_name_looks_like_text_is_still_read_as_a_file(corpus, tmp_path):
    """A path with a newline in its name (or a very long one) is a Path here, never tokenised as text."""
    odd = corpus / "we\nird.txt"
    odd.write_text(make_stories(5, 3), encoding="utf-8")
    tok = Tokenizer.train([corpus / "a.txt"], vocab_size=300)
    ids = token_ids([odd], tok, tmp_path / "cache")
    assert tok.decode_bytes(np.asarray(ids, dtype=np.int64)) == odd.read_bytes()


def test_a_tokenizer_trained_on_a_folder_reads_the_files_training_reads(corpus):
    """Hidden files and folders are left out by both (the corpus holds .hidden.txt; add a hidden folder)."""
    (corpus / ".cache").mkdir()
    (corpus / ".cache" / "c.txt").write_text("zyxwv " * 200, encoding="utf-8")
    from glassllm.tokenizer import text_files

    assert text_files(corpus) == expand_paths(corpus)
    assert Tokenizer.train(corpus, vocab_size=300).encode("zyxwv") == \
        Tokenizer.train(expand_paths(corpus), vocab_size=300).encode("zyxwv")


def test_files_of_a_folder_are_separate_documents(tmp_path):
    """One story per file, no separator lines: an end-of-text id goes between the files (not after a file
    that already ends with one, and not after the last)."""
    folder = tmp_path / "stories"
    folder.mkdir()
    (folder / "a.txt").write_text("Tom had a red ball. The end.", encoding="utf-8")
    (folder / "b.txt").write_text("Sue ran to the park.\n<|endoftext|>\n", encoding="utf-8")
    (folder / "c.txt").write_text("Max saw a cat.", encoding="utf-8")
    tok = Tokenizer.train([make_stories(30, 0)], vocab_size=300)
    ids = np.asarray(token_ids(folder, tok, tmp_path / "cache"), dtype=np.int64)
    assert tok.decode(ids) == ("Tom had a red ball. The end.<|endoftext|>Sue ran to the park.\n<|endoftext|>\n"
                               "Max saw a cat.")
    assert int((ids == tok.eot_id).sum()) == 2


def test_hub_file_names_stay_inside_the_dataset(tmp_path):
    for name in ("../../../escaped.txt", "/etc/hostname", "", "a//b.txt"):
        with pytest.raises(ValueError, match="must be a relative path inside the dataset"):
            fetch_hub_file("a/b", name, tmp_path, endpoint="http://127.0.0.1:9", progress=False)
    with pytest.raises(ValueError, match="inside the dataset"):
        resolve_sources(["hf:a/b//etc/hostname"], cache_dir=tmp_path, progress=False)
    assert not (tmp_path.parent / "escaped.txt").exists()


def test_a_download_cut_by_the_network_names_the_url_not_the_disk(tmp_path, monkeypatch):
    """A connection reset mid-body is a download error naming the URL (it read as a write error)."""
    class Cut:
        headers = {"Content-Length": "100"}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, n):
            raise ConnectionResetError("Connection reset by peer")

    monkeypatch.setattr(data.urllib.request, "urlopen", lambda *a, **k: Cut())
    with pytest.raises(ValueError, match=r"cannot download http://hub\.test/datasets/o/n/resolve/main/x\.txt: "
                                         r"Connection reset"):
        fetch_hub_file("o/n", "x.txt", tmp_path, endpoint="http://hub.test", progress=False)
    assert not list((tmp_path / "datasets--o--n" / "main").iterdir())


def test_distinct_ids_are_counted_in_chunks():
    ids = np.random.default_rng(0).integers(0, 900, size=(1 << 22) + 12345).astype(np.uint16)
    np.testing.assert_array_equal(data._distinct(ids), np.unique(ids))
