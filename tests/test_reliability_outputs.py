"""What the commands write, and over what: nothing is replaced that a user did not ask to replace.

- An atomic write through a symbolic link rewrites the file the link names
  (the link stays a link); a device, a pipe or a folder is refused.
- ``export`` and ``import-hf`` refuse to write over their own input, and
  ``train`` over a folder holding a run or some other model file;
  ``tokenize --out``, ``inspect --html`` and ``import-hf`` refuse to replace
  an existing file of another kind (a model, the training text), and replace
  one of their own kind (running a command again).
- Two trainings never share a run folder: the second is refused while the
  first holds the folder's lock.
- A resumed run keeps its tokenizer; a recipe's values are named as the
  recipe's when they differ from the resumed run's.
- A machine that cannot hold a requested model says so in one line
  (``MemoryError`` is caught like any other bad input), and ``eval`` of a
  model whose loss is finite but huge reports an infinite perplexity instead
  of failing on ``exp``.

The inventory (``test_reliability_inputs.py``, kinds "empty path", "output in
the way", "option that does not apply") holds the one-line errors of these
refusals; the tests here check what happens to the files.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from glassllm import cli
from glassllm.checkpoint import atomic_write, load_model, save_model
from tests.test_reliability_inventory import get_env

TRAIN = ["--data", "train.txt", "--tokenizer", "tok.json", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
         "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1", "--no-progress"]


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    env = get_env()
    for name in ("train.txt", "tok.json", "tiny.safetensors"):
        shutil.copy(env.root / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(argv, capsys) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


def test_a_write_through_a_link_rewrites_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to("real.txt")
    atomic_write(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new"
    (tmp_path / "dangling.txt").symlink_to("made.txt")
    atomic_write(tmp_path / "dangling.txt", "made")
    assert (tmp_path / "dangling.txt").is_symlink() and (tmp_path / "made.txt").read_text() == "made"


def test_a_replaced_file_keeps_its_permissions_and_a_new_one_gets_ordinary_ones(tmp_path):
    private = tmp_path / "private.json"
    private.write_text("old")
    private.chmod(0o600)
    atomic_write(private, "new")
    assert private.read_text() == "new" and (private.stat().st_mode & 0o777) == 0o600
    atomic_write(tmp_path / "fresh.json", "x")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "fresh.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_typo_in_valid_is_found_before_anything_is_downloaded(tmp_path, monkeypatch, capsys):
    """Local paths are checked first: a failed fresh run would remove its folder, and with it a download."""
    from glassllm import data

    fetched = []
    monkeypatch.setattr(data, "fetch_hub_file", lambda *a, **k: fetched.append(a) or (_ for _ in ()).throw(
        AssertionError("no download expected")))
    monkeypatch.chdir(tmp_path)
    code, err = run(["train", "--data", "tinystories:train", "--valid", "vaild.txt", "--out", "r", "--no-progress"],
                    capsys)
    assert code == 2 and "--valid path 'vaild.txt' does not exist" in err and fetched == []


def test_devices_pipes_and_folders_are_not_replaced(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()
    for target, words in [("/dev/null", "not a regular file"), (tmp_path / "pipe", "not a regular file"),
                          (tmp_path / "dir", "a folder")]:
        with pytest.raises(ValueError, match=words):
            atomic_write(target, "x")
    assert Path("/dev/null").is_char_device() and (tmp_path / "pipe").is_fifo() and (tmp_path / "dir").is_dir()
    with pytest.raises(ValueError, match="empty path"):
        atomic_write("", "x")


def test_export_and_import_never_overwrite_their_input(folder, capsys):
    pytest.importorskip("safetensors")
    code, err = run(["export", "tiny.safetensors", "hf"], capsys)
    assert code == 0, err
    before = (folder / "hf" / "model.safetensors").read_bytes()
    code, err = run(["import-hf", "hf", "hf/model.safetensors"], capsys)
    assert code == 2 and "into the checkpoint folder 'hf' being read" in err
    assert (folder / "hf" / "model.safetensors").read_bytes() == before
    kept = {p.name: p.read_bytes() for p in (folder / "hf").iterdir()}
    code, err = run(["import-hf", "hf", "hf/generation_config.json"], capsys)   # any file of the folder
    assert code == 2 and "into the checkpoint folder" in err
    assert {p.name: p.read_bytes() for p in (folder / "hf").iterdir()} == kept
    shutil.copy(folder / "tiny.safetensors", folder / "model.safetensors")
    code, err = run(["export", "model.safetensors", "."], capsys)
    assert code == 2 and "is the input file" in err
    load_model(folder / "model.safetensors")                          # still the glassllm file


def test_a_typo_in_an_output_name_never_destroys_a_model_or_the_text(folder, capsys):
    model, text = (folder / "tiny.safetensors").read_bytes(), (folder / "train.txt").read_bytes()
    cases = [
        (["tokenize", "--train", "train.txt", "--vocab-size", "300", "--out", "tiny.safetensors"],
         "'tiny.safetensors' already exists and is not a glassllm tokenizer file"),
        (["tokenize", "--train", "train.txt", "--vocab-size", "300", "--out", "train.txt"],
         "'train.txt' is also this command's input"),
        (["inspect", "Hi", "--model", "tiny.safetensors", "--html", "train.txt"],
         "'train.txt' already exists and is not an earlier inspector export"),
        (["inspect", "Hi", "--model", "tiny.safetensors", "--html", "tiny.safetensors"],
         "'tiny.safetensors' is also this command's input"),
    ]
    code, err = run(["export", "tiny.safetensors", "hf"], capsys)
    assert code == 0, err
    cases.append((["import-hf", "hf", "train.txt"], "'train.txt' already exists and is not a glassllm model file"))
    for argv, words in cases:
        code, err = run(argv, capsys)
        assert code == 2 and words in err and err.count("\n") == 1, (argv, err)
        assert (folder / "tiny.safetensors").read_bytes() == model and (folder / "train.txt").read_bytes() == text
    # Files of the command's own kind are replaced: running it again is normal.
    for argv in (["tokenize", "--train", "train.txt", "--vocab-size", "300", "--out", "new.json"],
                 ["inspect", "Hi", "--model", "tiny.safetensors", "--html", "page.html", "--steps", "0"],
                 ["import-hf", "hf", "back.safetensors"]):
        for _ in range(2):
            code, err = run(argv, capsys)
            assert code == 0, (argv, err)


def test_train_keeps_its_hands_off_a_folder_with_another_model(folder, capsys):
    code, err = run(["export", "tiny.safetensors", "hf"], capsys)
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in (folder / "hf").iterdir()}
    code, err = run(["train", *TRAIN, "--out", "hf"], capsys)
    assert code == 2 and "holds a model.safetensors that no run there saved" in err
    assert {p.name: p.read_bytes() for p in (folder / "hf").iterdir() if p.name != ".lock"} == before


def test_a_run_folder_in_use_is_refused(folder, capsys):
    from glassllm.train import lock_run_folder

    held = lock_run_folder(folder / "busy")
    try:
        proc = subprocess.run([sys.executable, "-m", "glassllm.cli", "train", *TRAIN, "--out", "busy"],
                              capture_output=True, text=True, cwd=folder, timeout=300)
    finally:
        held.close()
    assert proc.returncode == 2 and "is in use by another glassllm train" in proc.stderr, proc.stderr
    assert not (folder / "busy" / "train_state.safetensors").exists()
    code, err = run(["train", *TRAIN, "--out", "busy"], capsys)      # once released, the run goes ahead
    assert code == 0, err
    assert (folder / "busy" / "train_state.safetensors").exists()


def test_a_resumed_run_keeps_its_tokenizer_and_names_the_recipes_values(folder, capsys):
    code, err = run(["train", *TRAIN, "--out", "r", "--until", "1"], capsys)
    assert code == 0, err
    code, err = run(["train", "--out", "r", "--resume", "--tokenizer", "tok.json", "--no-progress"], capsys)
    assert code == 2 and "cannot change a resumed run" in err
    code, err = run(["train", "--out", "r", "--resume", "--recipe", "bundled", "--no-progress"], capsys)
    assert code == 2 and "--recipe bundled sets --steps" in err and "resumed run's 2" in err
    code, err = run(["train", "--out", "r", "--resume", "--steps", "5", "--no-progress"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--steps 5 differs" in err and "--recipe" not in err


def test_a_model_too_large_for_memory_is_one_line(folder, capsys, monkeypatch):
    import glassllm.nn

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 74.5 GiB for an array with shape (100000, 200000)")

    monkeypatch.setattr(glassllm.nn.Transformer, "__init__", no_memory)
    code, err = run(["train", *TRAIN, "--out", "big"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("glassllm train: error: not enough memory: Unable to allocate 74.5 GiB"), err


def test_eval_reports_an_infinite_perplexity_for_a_huge_finite_loss(folder):
    from glassllm.train import evaluate

    model, tok, _ = load_model(folder / "tiny.safetensors")
    ids = np.array(tok.encode("once upon a time there was a dog " * 4), dtype=np.int64)
    state = model.state_dict()
    state["output.weight"] = state["output.weight"] * 1e25                # logits ~1e25: finite, loss ~1e25
    model.load_state_dict(state)
    result = evaluate(model, ids, tok, seq_len=16)
    assert math.isfinite(result.loss) and result.loss > 1e20
    assert result.perplexity == math.inf and math.isfinite(result.bits_per_byte)


def test_eval_defaults_to_the_trained_window_of_a_short_model(folder, capsys):
    code, err = run(["train", *TRAIN, "--out", "short", "--max-seq-len", "32"], capsys)
    assert code == 0, err
    code = cli.main(["eval", "--model", "short/model.safetensors", "--data", "train.txt", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    import json
    result = json.loads(out.out)
    model, tok, _ = load_model(folder / "short" / "model.safetensors")
    n = len(tok.encode_corpus((folder / "train.txt").read_text()))
    assert result["seq_len"] == 16 and result["windows"] == math.ceil((n - 1) / 16)   # trained on 16, context 32


def test_a_tokenizer_file_may_start_with_a_byte_order_mark_or_a_newline(folder):
    from glassllm.commands.tokenize import tokenizer_from_file
    from glassllm.tokenizer import Tokenizer

    text = (folder / "tok.json").read_bytes()
    for prefix in (b"\xef\xbb\xbf", b"\n  "):
        (folder / "t.json").write_bytes(prefix + text)
        assert tokenizer_from_file(folder / "t.json").encode("a dog") == Tokenizer.load(folder / "tok.json").encode("a dog")
    save_model(folder / "m.safetensors", *load_model(folder / "tiny.safetensors")[:2])
    assert tokenizer_from_file(folder / "m.safetensors").vocab_size == 300   # and a model file is still a model file


def test_a_refused_run_leaves_no_folder_behind(folder, capsys):
    code, err = run(["train", *TRAIN[2:], "--data", "no-such.txt", "--out", "never"], capsys)
    assert code == 2 and "no-such.txt" in err and not (folder / "never").exists()
    (folder / "kept").mkdir()                                           # a folder that was there stays
    code, err = run(["train", *TRAIN[2:], "--data", "no-such.txt", "--out", "kept"], capsys)
    assert code == 2 and (folder / "kept").is_dir()


def test_a_bad_option_is_one_line_with_a_pointer_to_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "hi", "--seed", "abc"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err == "glassllm generate: error: argument --seed: invalid int value: 'abc' (see glassllm generate --help)\n"
    # An argument no command knows is said by the command it was given to, with that command's help.
    for argv, command in ((["generate", "hi", "--bogus"], "glassllm generate"), (["tokenize", "hi", "extra"],
                          "glassllm tokenize"), (["--bogus"], "glassllm")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
        assert capsys.readouterr().err == (f"{command}: error: unrecognized arguments: {argv[-1]} "
                                           f"(see {command} --help)\n")
