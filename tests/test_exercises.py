"""The exercises' checkers: each reference solution passes, and typical wrong answers fail with the
message that names their mistake.

The wrong answers below are the ones students write: an exp without the
shift, the mask that forgets ``start``, RoPE in split halves, LayerNorm for
RMSNorm, the diagonal of the softmax Jacobian. Each is a small file, checked
as a student's file is, through ``glassllm check``.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from glassllm.cli import main
from glassllm.exercises import EXERCISES, check, load_function, solutions, stub

# (exercise, body of the student's function, text the checker's message must contain)
WRONG = [
    # softmax(x)
    ("softmax", "e = np.exp(x)\nreturn e / e.sum(axis=-1, keepdims=True)", "exp overflowed"),
    ("softmax", "e = np.exp(x - x.max())\nreturn e / e.sum(axis=-1, keepdims=True)",
     "underflowed to 0 in the whole row"),
    ("softmax", "e = np.exp(x - x.max(axis=-1, keepdims=True))\nreturn e / e.sum(axis=0, keepdims=True)",
     "row 0 sums to"),
    ("softmax", "x = x.astype(np.float64)\ne = np.exp(x - x.max(axis=-1, keepdims=True))\n"
                "return e / e.sum(axis=-1, keepdims=True)", "dtype float64, expected float32"),
    ("softmax", "e = np.exp(x - x.max(axis=-1, keepdims=True))\nreturn e / e.sum(axis=-1, keepdims=True)",
     "row 3 is all -inf (every key forbidden): expected all zeros"),
    ("softmax", "e = np.exp(x - x.max(axis=-1, keepdims=True))\nreturn (e / e.sum(axis=-1, keepdims=True))[:, 0]",
     "returned shape (4,), expected the shape of x = (4, 6)"),
    # causal_mask(n, m, start)
    ("causal_mask", "return np.triu(np.ones((n, m), dtype=bool), 1)", "ignores start"),
    ("causal_mask", "return np.arange(m)[None, :] >= start + np.arange(n)[:, None]",
     "is query 0's own position: a query reads itself (off by one"),
    ("causal_mask", "return np.arange(m)[None, :] <= start + np.arange(n)[:, None]", "the mask is inverted"),
    ("causal_mask", "return np.triu(np.ones((n, n), dtype=bool), 1)",
     "causal_mask(2, 5, 3) returned shape (2, 2), expected (n, m) = (2, 5)"),
    ("causal_mask", "return (np.arange(m)[None, :] > start + np.arange(n)[:, None]).astype(int)",
     "returned dtype int64, expected bool (True = forbidden)"),
    ("causal_mask", "mask = np.arange(m)[None, :] > start + np.arange(n)[:, None]\nmask[-1, -1] = False\n"
                    "mask[0, -1] = False\nreturn mask", "query 0 (position 0) may read key 2, which is in its "
                                                         "future: the masked cell leaks"),
    # attention_head(q, k, v)
    ("attention_head", "n, m = len(q), len(k)\nw = q @ k.T / np.sqrt(q.shape[1])\n"
                       "w = np.exp(w - w.max(axis=-1, keepdims=True))\nreturn w / w.sum(axis=-1, keepdims=True) @ v",
     "no causal mask"),
    ("attention_head", "n, m = len(q), len(k)\ns = q @ k.T\n"
                       "s[np.arange(m)[None] > m - n + np.arange(n)[:, None]] = -np.inf\n"
                       "w = np.exp(s - s.max(axis=-1, keepdims=True))\nreturn w / w.sum(axis=-1, keepdims=True) @ v",
     "not divided by sqrt(D)"),
    ("attention_head", "n, m = len(q), len(k)\ns = q @ k.T / np.sqrt(q.shape[1])\n"
                       "s[np.arange(m)[None] > np.arange(n)[:, None]] = -np.inf\n"
                       "w = np.exp(s - s.max(axis=-1, keepdims=True))\nreturn w / w.sum(axis=-1, keepdims=True) @ v",
     "the mask ignores start: with n=2 queries and m=5 keys"),
    ("attention_head", "n, m = len(q), len(k)\ns = q @ k.T / np.sqrt(q.shape[1])\n"
                       "s[np.arange(m)[None] > m - n + np.arange(n)[:, None]] = -np.inf\n"
                       "w = np.exp(s)\nreturn w / w.sum(axis=-1, keepdims=True) @ v", "exp overflowed"),
    ("attention_head", "n, m = len(q), len(k)\ns = q @ k.T / np.sqrt(q.shape[1])\n"
                       "s[np.arange(m)[None] > m - n + np.arange(n)[:, None]] = -np.inf\n"
                       "w = np.exp(s - s.max(axis=-1, keepdims=True))\n"
                       "return (w / w.sum(axis=-1, keepdims=True) @ v).astype(np.float64)", "dtype float64"),
    ("attention_head", "n, m = len(q), len(k)\ns = q @ k.T / np.sqrt(q.shape[1])\n"
                       "s[np.arange(m)[None] > m - n + np.arange(n)[:, None] + 1] = -np.inf\n"
                       "w = np.exp(s - s.max(axis=-1, keepdims=True))\nreturn w / w.sum(axis=-1, keepdims=True) @ v",
     "output row 0 changes when key/value 1 changes, but query 0 sits at position 0 and key 1 is in its "
     "future: the masked cell leaks"),
    # rope_vector(x, pos, theta)
    ("rope_vector", "D = len(x)\na = pos * theta ** (-2.0 * np.arange(D // 2) / D)\n"
                    "x0, x1 = x[:D // 2], x[D // 2:]\n"
                    "return np.concatenate([x0 * np.cos(a) - x1 * np.sin(a), x0 * np.sin(a) + x1 * np.cos(a)])"
                    ".astype(x.dtype)", "split halves"),
    ("rope_vector", "D = len(x)\na = (pos + 1) * theta ** (-2.0 * np.arange(D // 2) / D)\nout = x.copy()\n"
                    "out[0::2] = x[0::2] * np.cos(a) - x[1::2] * np.sin(a)\n"
                    "out[1::2] = x[0::2] * np.sin(a) + x[1::2] * np.cos(a)\nreturn out",
     "off by one: your result is RoPE at position 4, not 3"),
    ("rope_vector", "D = len(x)\na = pos * theta ** (-2.0 * np.arange(D // 2) / D)\nout = x.copy()\n"
                    "out[0::2] = x[0::2] * np.cos(a) + x[1::2] * np.sin(a)\n"
                    "out[1::2] = -x[0::2] * np.sin(a) + x[1::2] * np.cos(a)\nreturn out", "turn the wrong way"),
    ("rope_vector", "D = len(x)\na = pos * theta ** (-1.0 * np.arange(D // 2) / D)\nout = x.copy()\n"
                    "out[0::2] = x[0::2] * np.cos(a) - x[1::2] * np.sin(a)\n"
                    "out[1::2] = x[0::2] * np.sin(a) + x[1::2] * np.cos(a)\nreturn out", "wrong speeds"),
    ("rope_vector", "D = len(x)\na = pos * 10000.0 ** (-2.0 * np.arange(D // 2) / D)\nout = x.copy()\n"
                    "out[0::2] = x[0::2] * np.cos(a) - x[1::2] * np.sin(a)\n"
                    "out[1::2] = x[0::2] * np.sin(a) + x[1::2] * np.cos(a)\nreturn out",
     "theta is ignored: this call passed theta=500000"),
    # rms_norm(x, weight, eps)
    ("rms_norm", "c = x - x.mean(axis=-1, keepdims=True)\n"
                 "return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps) * weight", "that is LayerNorm"),
    ("rms_norm", "return x / np.sqrt((x * x).mean(axis=-1, keepdims=True)) * weight",
     "eps is missing"),
    ("rms_norm", "return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)", "the weight is not applied"),
    ("rms_norm", "return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps) * weight",
     "sqrt(sum(x**2))"),
    ("rms_norm", "return x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + eps) * weight",
     "eps is added after the square root"),
    # softmax_backward(p, g)
    ("softmax_backward", "return p * g", "missing the -p * sum(g * p) term"),
    ("softmax_backward", "return p * (1 - p) * g", "only the diagonal of the Jacobian"),
    ("softmax_backward", "return p * ((g * p).sum(axis=-1, keepdims=True) - g)", "the sign is flipped"),
    ("softmax_backward", "return p * (g - (g * p).sum(axis=0, keepdims=True))", "the sum runs over the first axis"),
    ("softmax_backward", "return p * (g - (g * p).sum(axis=-1, keepdims=True)) + 0.01",
     "row 0 of your gradient sums to"),
]


def _write(tmp_path, name: str, body: str):
    """A student's file defining ``name`` with the given body (and the stub's signature)."""
    head = stub(name).split("    raise NotImplementedError")[0]
    path = tmp_path / f"{name}.py"
    path.write_text(head + textwrap.indent(body, "    ") + "\n", encoding="utf-8")
    return path


def test_there_are_six_exercises_each_with_a_solution_and_a_lesson():
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    assert {"softmax", "causal_mask", "attention_head", "rope_vector", "rms_norm",
            "softmax_backward"} <= set(EXERCISES)
    for ex in EXERCISES.values():
        assert callable(ex.solution)
        assert (docs / ex.lesson).is_file(), ex.lesson


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_reference_solution_passes(name):
    result = check(name, getattr(solutions, name))
    assert result.passed, result.message
    assert result.message.startswith(f"{name}: right")


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_solution_as_a_file_passes_through_the_command(name, tmp_path, capsys):
    path = _write(tmp_path, name, "pass")                       # the stub's signature and docstring ...
    source = path.read_text(encoding="utf-8")
    import inspect

    body = inspect.getsource(getattr(solutions, name)).split('"""')[2]   # ... and the solution's body
    path.write_text(source.replace("    pass\n", body.lstrip("\n")), encoding="utf-8")
    assert main(["check", name, str(path)]) == 0
    assert "right" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(EXERCISES))
def test_each_checker_finds_its_own_reference_independent(name):
    """The checker compares with glassllm's own code, not with the solution: a solution that is off
    by a tiny amount everywhere fails."""
    solution = getattr(solutions, name)

    def nudged(*args):
        out = solution(*args)
        return out ^ True if out.dtype == bool else out + (1e-3 * np.abs(out).max() + 1e-3)
    assert not check(name, nudged).passed


@pytest.mark.parametrize("name, body, expected", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)])
def test_a_typical_mistake_fails_with_its_message(name, body, expected, tmp_path, capsys):
    path = _write(tmp_path, name, body)
    assert main(["check", name, str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{name}: wrong: "), out
    assert expected in out, out
    assert 1 <= len(out.strip().splitlines()) <= 2, out


def test_at_least_three_mistakes_per_exercise():
    counts = {name: sum(w[0] == name for w in WRONG) for name in EXERCISES}
    assert min(counts.values()) >= 3, counts


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_untouched_stub_is_not_written_yet(name, tmp_path, capsys):
    path = tmp_path / f"{name}.py"
    assert main(["check", name, "--stub"]) == 0
    path.write_text(capsys.readouterr().out, encoding="utf-8")
    assert main(["check", name, str(path)]) == 1
    assert capsys.readouterr().out.strip() == f"{name}: wrong: {name} is not written yet: it raises NotImplementedError"


def test_a_file_with_a_syntax_error_could_not_be_checked(tmp_path, capsys):
    bad = tmp_path / "a.py"
    bad.write_text("import numpy as np\n\ndef softmax(x)\n    return x\n", encoding="utf-8")
    assert main(["check", "softmax", str(bad)]) == 2                 # the check could not run: not "wrong"
    out, err = capsys.readouterr()
    assert out == "" and "a.py line 3: SyntaxError" in err and len(err.strip().splitlines()) == 1


def test_a_file_that_fails_to_run_is_a_wrong_answer(tmp_path, capsys):
    bad = tmp_path / "a.py"
    bad.write_text("import numpy as np\n1 / 0\n", encoding="utf-8")
    assert main(["check", "softmax", str(bad)]) == 1
    assert "a.py line 2 raised ZeroDivisionError" in capsys.readouterr().out
    bad.write_text("def softmax(x):\n    return [1.0]\n", encoding="utf-8")
    assert main(["check", "softmax", str(bad)]) == 1
    assert "softmax returned list, expected a NumPy array" in capsys.readouterr().out


def test_sys_exit_in_the_file_is_a_wrong_answer_not_a_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)                 # the file named as students name it, relative
    bad = tmp_path / "a.py"
    bad.write_text("def softmax(x):\n    import sys\n    sys.exit(0)\n", encoding="utf-8")
    assert main(["check", "softmax", str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("softmax: wrong: softmax raised SystemExit(0): sys.exit was called"), out
    assert len(out.strip().splitlines()) == 2, out
    bad.write_text("import numpy as np\nraise SystemExit(5)\n", encoding="utf-8")
    assert main(["check", "softmax", "a.py"]) == 1
    out = capsys.readouterr().out
    assert out.strip() == "softmax: wrong: a.py line 2 raised SystemExit(5): sys.exit was called", out


def test_ctrl_c_in_the_file_still_interrupts(tmp_path, capsys):
    bad = tmp_path / "a.py"
    bad.write_text("def softmax(x):\n    raise KeyboardInterrupt\n", encoding="utf-8")
    assert main(["check", "softmax", str(bad)]) == 130
    assert capsys.readouterr().err.strip() == "glassllm check: interrupted"


@pytest.mark.parametrize("raising, said", [("GeneratorExit", "GeneratorExit"),
                                           ("GeneratorExit('bye')", "GeneratorExit: bye"),
                                           ("Boom('no')", "Boom: no")])
def test_a_base_exception_from_the_file_is_a_wrong_answer(raising, said, tmp_path, capsys):
    """Exceptions outside Exception (GeneratorExit, a student's own BaseException) fail the answer in one
    line, at import and when the function runs, as sys.exit does; only Ctrl-C stops the check."""
    bad = tmp_path / "a.py"
    head = "class Boom(BaseException):\n    pass\n\n"
    bad.write_text(f"{head}raise {raising}\n", encoding="utf-8")
    assert main(["check", "softmax", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == f"softmax: wrong: a.py line 4 raised {said}\n" and err == "", (out, err)
    bad.write_text(f"{head}def softmax(x):\n    raise {raising}\n", encoding="utf-8")
    assert main(["check", "softmax", str(bad)]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"softmax: wrong: softmax raised {said}" and lines[1].startswith("  on: x (")
    assert len(lines) == 2 and err == "", (out, err)
    result = check("softmax", load_function(bad, "softmax"))          # the same from Python
    assert not result.passed and result.message.splitlines()[0] == f"softmax: wrong: softmax raised {said}"


@pytest.mark.parametrize("data, line, at", [
    (b"import numpy as np\n\ndef softmax(x):\n    return x\x00\n", 4, 48),
    (b"import numpy as np\r\n\r\ndef softmax(x):\r\n    return x\x00\r\n", 4, 51),   # Windows lines
    (b"x = 1\ry = 2\x00\n", 2, 11),                                                    # old Mac lines
    (b"\x00def softmax(x):\n    return x\n", 1, 0),
])
def test_a_nul_byte_in_the_file_is_named_with_its_line(data, line, at, tmp_path, capsys):
    """Python refuses source with a NUL byte without saying where; the checker names the line and the
    byte's position (counted here by hand), and the check could not run: exit code 2."""
    bad = tmp_path / "a.py"
    bad.write_bytes(data)
    assert main(["check", "softmax", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"glassllm check: error: a.py line {line}: a NUL byte (0x00) at position {at}; "
                                 "expected Python source text, which has no NUL bytes: remove it, then check "
                                 "again\n"), err
    with pytest.raises(ValueError, match=f"^a.py line {line}: a NUL byte"):
        load_function(bad, "softmax")


def test_bad_usage_is_exit_code_2_with_one_line(tmp_path, capsys):
    other = tmp_path / "other.py"
    other.write_text("def soft_max(x):\n    return x\n", encoding="utf-8")
    not_utf8 = tmp_path / "not_utf8.py"
    not_utf8.write_bytes(b"\xff\xfe bad")
    cases = [
        (["check", "softmax", str(tmp_path / "missing.py")], "no such file"),
        (["check", "softmax", str(other)], "defines no function softmax()"),
        (["check", "sofmax", str(other)], "no exercise is named 'sofmax'"),
        (["check"], "name an exercise"),
        (["check", "softmax"], "name the file to check"),
        (["check", "softmax", ""], "empty path"),
        (["check", "softmax", str(tmp_path)], f"{str(tmp_path)!r}: is a folder, not a file"),
        (["check", "softmax", str(not_utf8)], "not_utf8.py' is not UTF-8 text (byte 0xff at position 0); "
                                              "expected a Python source file in UTF-8"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, (argv, err)


def test_list_and_stub(capsys):
    assert main(["check", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert all(name in listed for name in EXERCISES)
    assert main(["check", "--stub", "rope_vector"]) == 0
    text = capsys.readouterr().out
    assert "def rope_vector(x, pos, theta=10000.0):" in text and "interleaved pairs" in text
    assert "glassllm check rope_vector rope_vector.py" in text
    compile(text, "stub", "exec")


def test_load_function_reads_the_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("import numpy as np\n\ndef rms_norm(x, weight, eps=1e-5):\n    return x\n", encoding="utf-8")
    f = load_function(path, "rms_norm")
    assert f(np.ones(2), None).tolist() == [1.0, 1.0]


def test_the_docs_show_each_solution_word_for_word_folded_away():
    import inspect
    import re
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "exercises" / "index.md").read_text(encoding="utf-8")
    assert "pymdownx.details" in (root / "mkdocs.yml").read_text(encoding="utf-8")   # ??? folds
    folded = re.findall(r'^\?\?\? note "Solution"\n\n    ```python\n(.*?)\n    ```$', page, flags=re.S | re.M)
    shown = {re.match(r"def (\w+)", textwrap.dedent(block)).group(1): textwrap.dedent(block) for block in folded}
    assert set(shown) == set(EXERCISES)
    for name in EXERCISES:
        assert shown[name] == inspect.getsource(getattr(solutions, name)).rstrip("\n"), name
        assert f"glassllm check {name} --stub" in page


def test_the_sample_message_on_the_exercises_page_is_the_checkers():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "exercises" / "index.md").read_text(encoding="utf-8")

    def naive(x):
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True)
    message = check("softmax", naive).message
    assert f"```text\n{message}\n```" in page, message
