"""``python -m glassllm.trace docs/snapshots.md``: regenerate the snapshot table of that page."""

from __future__ import annotations

import argparse
import sys

from .registry import write_snapshot_doc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glassllm.trace",
        description="Rewrite the generated snapshot table of a Markdown page (docs/snapshots.md) "
                    "from the tracer's registry; the rest of the page is kept.")
    parser.add_argument("page", metavar="FILE", help="the Markdown page holding the table, e.g. docs/snapshots.md")
    args = parser.parse_args(argv)
    try:
        write_snapshot_doc(args.page)
    except (ValueError, OSError) as e:
        print(f"python -m glassllm.trace: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
