"""The spec's "Complete numerical example" runs verbatim against the package.

The snippet and its verified output are copied here character for character
from the spec page "Causal attention: Q, K and V" (seed 000), so the test runs
on a machine without ``../shared``; when the page is present, a second test
checks the copy is still verbatim. The snippet is executed in a fresh
interpreter and the numbers it prints must equal the verified ones. A third
test re-derives those numbers by hand with :mod:`math`, so the page itself is
checked, not only our agreement with it.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SPEC_PAGE = Path(__file__).resolve().parents[1].parent / "shared" / "seeds" / "000_b95679cc17619f48.txt"

SNIPPET = """\
import numpy as np
from glassllm.nn import causal_mask
from glassllm.autograd import softmax_np

Q = np.array([[1., 0.], [1., 1.], [0., 1.]])
K = Q.copy()
V = np.array([[2., 0.], [0., 2.], [2., 2.]])
scores = Q @ K.T / np.sqrt(2)
masked = np.where(causal_mask(3, 3, 0), -np.inf, scores)
weights = softmax_np(masked)
print(np.round(weights, 6))
print(np.round(weights @ V, 6))
"""

VERIFIED = """\
Weights: [[1.000000, 0.000000, 0.000000],
          [0.330238, 0.669762, 0.000000],
          [0.197776, 0.401112, 0.401112]]
Output:  [[2.000000, 0.000000],
          [0.660477, 1.339523],
          [1.197776, 1.604448]]
"""

_NUMBER = re.compile(r"-?\d+\.\d*(?:e[-+]?\d+)?|-?\d+(?=[\s\]])")


def _numbers(text: str) -> np.ndarray:
    return np.array([float(s) for s in _NUMBER.findall(text)])


def _verified() -> tuple[np.ndarray, np.ndarray]:
    weights_part, output_part = VERIFIED.split("Output:")
    return _numbers(weights_part).reshape(3, 3), _numbers(output_part).reshape(3, 2)


def test_copy_is_verbatim():
    if not SPEC_PAGE.is_file():
        pytest.skip(f"needs ../shared: the spec page {SPEC_PAGE} is absent")
    page = SPEC_PAGE.read_text(encoding="utf-8")
    assert SNIPPET in page
    assert VERIFIED.rstrip("\n") in page


def test_snippet_prints_the_verified_numbers():
    run = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    weights_text, output_text = run.stdout.split("]]\n", 1)
    printed_weights = _numbers(weights_text + "]]").reshape(3, 3)
    printed_output = _numbers(output_text).reshape(3, 2)
    weights, output = _verified()
    # Both sides are rounded to 6 decimals: they must be the same numbers.
    np.testing.assert_array_equal(np.round(printed_weights, 6), weights)
    np.testing.assert_array_equal(np.round(printed_output, 6), output)


def test_verified_numbers_by_hand():
    """Row i's scores are q_i . k_j / sqrt(2) for j <= i; softmax them with math.exp."""
    Q = [(1.0, 0.0), (1.0, 1.0), (0.0, 1.0)]
    V = [(2.0, 0.0), (0.0, 2.0), (2.0, 2.0)]
    weights, output = _verified()
    for i in range(3):
        scores = [(Q[i][0] * Q[j][0] + Q[i][1] * Q[j][1]) / math.sqrt(2) for j in range(i + 1)]
        z = [math.exp(s - max(scores)) for s in scores]
        a = [x / sum(z) for x in z] + [0.0] * (2 - i)
        mixed = [sum(a[j] * V[j][d] for j in range(3)) for d in range(2)]
        assert weights[i] == pytest.approx(a, abs=5e-7)
        assert output[i] == pytest.approx(mixed, abs=5e-7)


def test_second_page_row_by_hand_matches_the_attention_op():
    """Seed 001's hand calculation: q=[1,0], keys [1,0],[0,1], values [10,0],[0,20] ->
    weights ~[0.670, 0.330], output ~[6.70, 6.60] -- through glassllm's fused attention."""
    from glassllm.autograd import Tensor
    from glassllm.kernels import attention

    q = Tensor(np.array([1.0, 0.0]).reshape(1, 1, 1, 2))
    k = Tensor(np.array([[1.0, 0.0], [0.0, 1.0]]).reshape(1, 1, 2, 2))
    v = Tensor(np.array([[10.0, 0.0], [0.0, 20.0]]).reshape(1, 1, 2, 2))
    out = attention(q, k, v, None, 1 / math.sqrt(2)).data.reshape(2)
    w0 = 1 / (1 + math.exp(-1 / math.sqrt(2)))
    np.testing.assert_allclose(out, [10 * w0, 20 * (1 - w0)], rtol=1e-12)
    np.testing.assert_allclose(np.round(out, 2), [6.70, 6.60])
    # Changing the first value changes the output but not where the query reads.
    v100 = Tensor(np.array([[100.0, 0.0], [0.0, 20.0]]).reshape(1, 1, 2, 2))
    out100 = attention(q, k, v100, None, 1 / math.sqrt(2)).data.reshape(2)
    np.testing.assert_allclose(out100, [100 * w0, 20 * (1 - w0)], rtol=1e-12)
