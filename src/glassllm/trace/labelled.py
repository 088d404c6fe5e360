"""Arrays with named axes and a label for every entry along them, as the analysis functions return them.

A :class:`Labelled` is a NumPy array plus ``dims`` (one name per axis) and
``labels`` (one list per axis): ``layer`` 0..L-1, ``position`` with token
pieces, ``component`` names such as ``L1H2``. ``np.asarray(x)`` gives the
numbers; ``x[...]`` indexes them; :meth:`Labelled.sel` picks by label;
:meth:`Labelled.plot` draws a heatmap (two axes) or bars (one axis) with
matplotlib, imported only then.
"""

from __future__ import annotations

import numpy as np

from ..optional import require


class Labelled:
    """``values`` (an array) with ``dims`` (axis names) and ``labels`` (a list of labels per axis).

    ``title`` says what the numbers are; ``baseline`` holds reference values
    (a patching sweep's clean and corrupted metric), or is empty.

    >>> x = Labelled(np.arange(6.0).reshape(2, 3), ("layer", "position"), [[0, 1], ["a", "b", "c"]])
    >>> x.shape, float(x.sel(layer=1, position="b"))
    ((2, 3), 4.0)
    """

    def __init__(self, values, dims, labels, title: str = "", baseline: dict | None = None):
        self.values = np.asarray(values)
        self.dims = tuple(dims)
        self.labels = [list(lab) for lab in labels]
        if len(self.dims) != self.values.ndim or len(self.labels) != self.values.ndim:
            raise ValueError(f"{self.values.ndim} axes need as many dims and label lists, "
                             f"got {len(self.dims)} and {len(self.labels)}")
        for dim, lab, size in zip(self.dims, self.labels, self.values.shape):
            if len(lab) != size:
                raise ValueError(f"axis {dim!r} has {size} entries but {len(lab)} labels")
        self.title = title
        self.baseline = dict(baseline or {})

    # -- array protocol ---------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    @property
    def shape(self) -> tuple:
        return self.values.shape

    def __getitem__(self, index):
        return self.values[index]

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        axes = ", ".join(f"{d}={n}" for d, n in zip(self.dims, self.shape))
        return f"Labelled({self.title or 'values'}; {axes})"

    # -- selection ----------------------------------------------------------------
    def sel(self, **chosen) -> "Labelled | np.ndarray":
        """Pick one label along some axes, by name: ``x.sel(layer=1, position="b")``.

        A label that occurs twice along its axis (a repeated token) is refused; use an index then.
        """
        index, keep = [], []
        for dim, lab in zip(self.dims, self.labels):
            if dim not in chosen:
                index.append(slice(None))
                keep.append(dim)
                continue
            want = chosen.pop(dim)
            hits = [i for i, x in enumerate(lab) if x == want]
            if len(hits) != 1:
                raise ValueError(f"{dim}={want!r} matches {len(hits)} labels; labels are {lab}")
            index.append(hits[0])
        if chosen:
            raise ValueError(f"no axis named {next(iter(chosen))!r}; axes are {self.dims}")
        values = self.values[tuple(index)]
        if not keep:
            return values
        labels = [lab for dim, lab in zip(self.dims, self.labels) if dim in keep]
        return Labelled(values, keep, labels, self.title, self.baseline)

    def argmax(self) -> dict:
        """The labels of the largest entry, by axis name: ``{"layer": 1, "head": 2}``."""
        at = np.unravel_index(int(np.argmax(self.values)), self.shape)
        return {dim: lab[i] for dim, lab, i in zip(self.dims, self.labels, at)}

    # -- drawing --------------------------------------------------------------------
    def plot(self, ax=None, cmap=None):
        """Draw with matplotlib: a heatmap for two axes (first axis down), bars for one; returns the artist.

        Signed numbers get a scale symmetric around 0. More than two axes:
        select some first (:meth:`sel`).
        """
        plt = require("matplotlib.pyplot", "Labelled.plot")

        if ax is None:
            _, ax = plt.subplots()
        finite = self.values[np.isfinite(self.values)]
        top = float(np.abs(finite).max()) if finite.size else 1.0
        if self.values.ndim == 1:
            out = ax.bar(range(len(self.values)), self.values)
            ax.set_xticks(range(len(self.values)), [str(x) for x in self.labels[0]], rotation=90)
            ax.set_xlabel(self.dims[0])
            ax.axhline(0, color="black", linewidth=0.5)
        elif self.values.ndim == 2:
            signed = finite.size and finite.min() < 0
            out = ax.imshow(self.values, aspect="auto", cmap=cmap or ("RdBu_r" if signed else "viridis"),
                            vmin=-top if signed else None, vmax=top if signed else None)
            ax.set_yticks(range(self.shape[0]), [str(x) for x in self.labels[0]])
            ax.set_xticks(range(self.shape[1]), [str(x) for x in self.labels[1]], rotation=90)
            ax.set_ylabel(self.dims[0])
            ax.set_xlabel(self.dims[1])
            ax.figure.colorbar(out, ax=ax)
        else:
            raise ValueError(f"plot draws one or two axes; this array has {self.dims}: choose with .sel(...) "
                             f"or index it first")
        if self.title:
            ax.set_title(self.title)
        return out
