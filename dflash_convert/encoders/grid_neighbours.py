"""The neighbour lists of ggml's IQ grids (``iq2xs_init_impl``, ``iq3xs_init_impl``), for IQ2/IQ1 and IQ3.

Every off-grid code gets the grid points at its ``nwant`` smallest distinct squared distances, by
(distance, index): ggml's qsort order, a total order, so deterministic. Specification:
docs/quantizers.md.
"""

from __future__ import annotations

import numpy as np


def neighbour_block(d2: np.ndarray, nwant: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Lists for the rows of ``d2`` [codes, G]: (each list's count then its members, concatenated; each list's offset)."""
    cut = d2.min(axis=1)
    for _ in range(nwant - 1):  # the nwant-th smallest distinct distance of each row
        cut = np.where(d2 > cut[:, None], d2, np.inf).min(axis=1)
    rows, cols = np.nonzero(d2 <= cut[:, None])
    order = np.lexsort((cols, d2[rows, cols], rows))
    rows, cols = rows[order], cols[order]
    counts = np.bincount(rows, minlength=d2.shape[0])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    head = starts + np.arange(d2.shape[0])
    block = np.empty(d2.shape[0] + rows.size, dtype)
    block[head] = counts
    block[np.repeat(head + 1, counts) + (np.arange(rows.size) - np.repeat(starts, counts))] = cols
    return block, head
