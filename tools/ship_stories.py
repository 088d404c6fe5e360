"""Write the story corpus that ships with glassllm (``src/glassllm/assets/stories*.txt.xz``).

    python -m tools.ship_stories [--shared ../shared/data/tinystories]

The training slice is the first 4,000 stories of the developers' TinyStories ``train.txt`` (a shuffled
copy, see ``../shared/data/README.md``); the held-out slice is the next 200 stories of the same file.
Nothing comes from ``valid.txt``, which stays the held-out set that the bundled model's figures use,
and the script refuses to write a slice that shares a story with it. Both files keep the TinyStories
layout (each story, then a line ``<|endoftext|>``) and are compressed with xz, which the standard
library reads (:mod:`lzma`). TinyStories is CDLA-Sharing-1.0: ``assets/STORIES_NOTICE.md`` says where
the text came from and what was changed, and ``assets/CDLA-Sharing-1.0.txt`` is the licence.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "src" / "glassllm" / "assets"
SEPARATOR = "\n<|endoftext|>\n"
TRAIN_STORIES, HELDOUT_STORIES = 4000, 200


def stories(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith(SEPARATOR), f"{path} does not end with an <|endoftext|> line"
    return text[: -len(SEPARATOR)].split(SEPARATOR)


def write(path: Path, chosen: list[str]) -> None:
    data = (SEPARATOR.join(chosen) + SEPARATOR).encode("utf-8")
    path.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    print(f"{path.relative_to(ROOT)}: {len(chosen):,} stories, {len(data):,} bytes of text, "
          f"{path.stat().st_size:,} compressed, text SHA-256 {hashlib.sha256(data).hexdigest()}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data" / "tinystories")
    args = parser.parse_args(argv)
    train, valid = stories(args.shared / "train.txt"), set(stories(args.shared / "valid.txt"))
    chosen = train[: TRAIN_STORIES + HELDOUT_STORIES]
    if valid & set(chosen):
        print("ship_stories: a chosen story is also in valid.txt; not writing", file=sys.stderr)
        return 1
    write(ASSETS / "stories.txt.xz", chosen[:TRAIN_STORIES])
    write(ASSETS / "stories-heldout.txt.xz", chosen[TRAIN_STORIES:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
