"""``python -m glassllm.trace docs/snapshots.md``: regenerate the snapshot table of that page."""

from __future__ import annotations

import sys

from .registry import write_snapshot_doc


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m glassllm.trace docs/snapshots.md", file=sys.stderr)
        return 2
    try:
        write_snapshot_doc(argv[0])
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
