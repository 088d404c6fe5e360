"""``python -m glassllm``: the ``glassllm`` command (:mod:`glassllm.cli`), for when the script is not on PATH."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
