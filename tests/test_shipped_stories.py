"""The stories that ship with glassllm: ``glassllm train`` with no ``--data`` trains on them, offline.

They are a slice of the developers' TinyStories ``train.txt`` (never ``valid.txt``, the held-out set of the
bundled model's figures) and carry their licence (CDLA-Sharing-1.0) and notice.
"""

from __future__ import annotations

import lzma

import pytest

from glassllm import cli
from glassllm.data import (DEFAULT_TRAIN, DEFAULT_VALID, SHIPPED_SOURCES, resolve_sources, shipped_source,
                           shipped_text)

SEPARATOR = "\n<|endoftext|>\n"


def _stories(text: str) -> list[str]:
    assert text.endswith(SEPARATOR)
    return text[: -len(SEPARATOR)].split(SEPARATOR)


def test_train_without_data_resolves_to_the_shipped_stories(tmp_path):
    from glassllm.commands.train import default_data

    args = cli.build_parser().parse_args(["train", "--recipe", "class", "--out", str(tmp_path / "run")])
    default_data(args)
    assert (args.data, args.valid) == ([DEFAULT_TRAIN], [DEFAULT_VALID])
    (train,) = resolve_sources(args.data, tmp_path / "cache")
    (valid,) = resolve_sources(args.valid, tmp_path / "cache")
    assert train.read_bytes() == lzma.decompress(SHIPPED_SOURCES[DEFAULT_TRAIN].read_bytes())
    assert len(_stories(train.read_text(encoding="utf-8"))) == 4000
    assert len(_stories(valid.read_text(encoding="utf-8"))) == 200
    assert not set(_stories(train.read_text(encoding="utf-8"))) & set(_stories(valid.read_text(encoding="utf-8")))
    # given --valid or --data, the user's choice stands
    args = cli.build_parser().parse_args(["train", "--valid", "v.txt"])
    default_data(args)
    assert (args.data, args.valid) == ([DEFAULT_TRAIN], ["v.txt"])
    args = cli.build_parser().parse_args(["train", "--data", "mine.txt"])
    default_data(args)
    assert (args.data, args.valid) == (["mine.txt"], None)


def test_the_slice_is_train_text_and_never_held_out_text(shared_data, tmp_path):
    train = _stories((shared_data / "tinystories" / "train.txt").read_text(encoding="utf-8"))
    valid = set(_stories((shared_data / "tinystories" / "valid.txt").read_text(encoding="utf-8")))
    ours = _stories(shipped_text(DEFAULT_TRAIN, tmp_path).read_text(encoding="utf-8"))
    held = _stories(shipped_text(DEFAULT_VALID, tmp_path).read_text(encoding="utf-8"))
    assert ours == train[:4000] and held == train[4000:4200]
    assert not (set(ours) | set(held)) & valid


def test_the_licence_and_notice_ship_beside_them():
    assets = SHIPPED_SOURCES[DEFAULT_TRAIN].parent
    licence = (assets / "CDLA-Sharing-1.0.txt").read_text(encoding="utf-8")
    assert licence.startswith("Community Data License Agreement - Sharing - Version 1.0")
    notice = (assets / "STORIES_NOTICE.md").read_text(encoding="utf-8")
    assert "CDLA-Sharing-1.0" in notice and "Eldan" in notice and "What was changed" in notice
    assert "STORIES_NOTICE.md" in (assets / "MODEL_CARD.md").read_text(encoding="utf-8")


def test_a_spec_that_is_not_shipped_is_refused(tmp_path):
    assert shipped_source("glassllm:nothing") is None and shipped_source("stories.txt") is None
    with pytest.raises(ValueError, match="'glassllm:nothing' is not a story file that ships with glassllm"):
        shipped_text("glassllm:nothing", tmp_path)
