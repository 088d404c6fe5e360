"""``glassllm check EXERCISE FILE``: check a write-it-yourself exercise.

::

    glassllm check --list                       # the exercises
    glassllm check softmax --stub > softmax.py  # the stub to fill in
    glassllm check softmax softmax.py           # 0: right; 1: wrong, with what is wrong

Bad usage (an unknown exercise, a missing file, a folder, a file not in UTF-8, a NUL byte in the
file, a syntax error, a file without the function) is exit code 2, like every other command's bad
input. Anything the file raises while it runs (sys.exit too) is a wrong answer, exit code 1.
"""

from __future__ import annotations

from .. import exercises as ex

__all__ = ["add_cli", "run"]


def add_cli(name: str, parser) -> None:
    parser.add_argument("exercise", nargs="?", metavar="EXERCISE", help="the exercise (see --list)")
    parser.add_argument("file", nargs="?", metavar="FILE", help="your Python file defining the function")
    parser.add_argument("--stub", action="store_true", help="print the exercise's stub file to fill in")
    parser.add_argument("--list", action="store_true", help="list the exercises")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.list:
        for one in ex.EXERCISES.values():
            print(f"{one.name:<18} {one.title}")
        return 0
    if args.exercise is None:
        raise ValueError(f"name an exercise: {', '.join(ex.EXERCISES)} (or --list)")
    ex.exercise(args.exercise)
    if args.stub:
        if args.file is not None:
            raise ValueError("--stub prints the stub; redirect it to a file instead of naming one "
                             f"(glassllm check {args.exercise} --stub > {args.exercise}.py)")
        print(ex.stub(args.exercise), end="")
        return 0
    if args.file is None:
        raise ValueError(f"name the file to check: glassllm check {args.exercise} FILE "
                         f"(start from: glassllm check {args.exercise} --stub)")
    result = ex.check(args.exercise, args.file)
    print(result.message)
    return 0 if result.passed else 1
