"""The live numbers the lesson's sentences and questions are made of: small pure functions of arrays, no Streamlit.

Maps are (gh, gw) arrays of non-negative weights over the patch grid; patches are numbered row by row from 0.
"""

from __future__ import annotations

import numpy as np


def effective_patches(amap: np.ndarray) -> float:
    """How many patches a map is spread over: 1 / sum(p_k^2) of the map scaled to sum 1 (the participation
    ratio). All weight on one patch: 1; spread evenly over n patches: n. A map of zeros counts as spread
    evenly over all of them."""
    p = np.clip(np.asarray(amap, dtype=np.float64).ravel(), 0.0, None)  # (N,)
    total = p.sum()
    if total <= 0:
        return float(p.size)
    p = p / total
    return float(1.0 / np.sum(p * p))


def top_patch(amap: np.ndarray) -> int:
    """The index (row by row) of a map's largest entry; the first one on ties."""
    return int(np.argmax(np.asarray(amap).ravel()))


def top_share(amap: np.ndarray, fraction: float = 0.1) -> float:
    """The share of a map's (positive) total that its top `fraction` of patches hold (at least one patch)."""
    p = np.sort(np.clip(np.asarray(amap, dtype=np.float64).ravel(), 0.0, None))[::-1]  # (N,) largest first
    total = p.sum()
    if total <= 0:
        return 0.0
    n = max(1, int(round(fraction * p.size)))
    return float(p[:n].sum() / total)


def most_focused_head(maps: np.ndarray) -> int:
    """Of the heads' maps (H, gh, gw), the head whose map is spread over the fewest patches (`effective_patches`)."""
    return int(np.argmin([effective_patches(m) for m in maps]))


def distinct_top_patches(maps: np.ndarray) -> int:
    """How many different patches are the top patch of some head: maps (H, gh, gw) -> 1..H."""
    return len({top_patch(m) for m in maps})


def most_global_layer(distances: np.ndarray) -> int:
    """The layer whose heads look farthest on average: mean attention distances (L, H) -> the layer with the largest
    mean over its heads (the first on ties)."""
    return int(np.argmax(np.asarray(distances).mean(axis=1)))


NEIGHBOURS, FAR, NO_PATTERN = "its neighbours", "patches far from it", "no pattern: all about the same"
POSITION_ANSWERS = (NEIGHBOURS, FAR, NO_PATTERN)


def most_similar_patches(similarity: np.ndarray, k: int, count: int = 4) -> list[int]:
    """The `count` patches whose position embeddings are most similar to patch k's, k itself left out: similarity
    (gh, gw) of patch k with every patch -> patch indices, most similar first."""
    flat = np.asarray(similarity, dtype=np.float64).ravel().copy()  # (N,)
    flat[k] = -np.inf
    return [int(i) for i in np.argsort(-flat, kind="stable")[:count]]


def grid_distance(a: int, b: int, grid: tuple[int, int]) -> float:
    """The distance between patches a and b on the grid, in patches (Euclidean between their rows and columns)."""
    (ra, ca), (rb, cb) = divmod(a, grid[1]), divmod(b, grid[1])
    return float(np.hypot(ra - rb, ca - cb))


def position_pattern(similarity: np.ndarray, k: int, grid: tuple[int, int], count: int = 4) -> str:
    """Which positions are most like patch k's (one of POSITION_ANSWERS), from the similarity (gh, gw) of patch k's
    position embedding with every patch's: NO_PATTERN when the other patches' similarities hardly differ (a spread
    below 0.05); else NEIGHBOURS when its `count` most similar patches are on average at most 1.5 times as far from
    it as its `count` nearest patches are, FAR when they are farther than the other patches are on average, else
    NO_PATTERN."""
    flat = np.asarray(similarity, dtype=np.float64).ravel()  # (N,)
    others = [j for j in range(flat.size) if j != k]
    if not others or float(np.std(flat[others])) < 0.05:
        return NO_PATTERN
    distances = np.array([grid_distance(k, j, grid) for j in others])  # (N-1,)
    near = np.mean([grid_distance(k, j, grid) for j in most_similar_patches(similarity, k, count)])
    if near <= 1.5 * np.sort(distances)[:count].mean():
        return NEIGHBOURS
    if near > distances.mean():
        return FAR
    return NO_PATTERN


def number_choices(answer: int, others: list[int]) -> list[int]:
    """Options for a "how many" question: the answer and the distinct other numbers, smallest first."""
    return sorted({int(answer), *(int(o) for o in others)})


def top_layer_from(tops: np.ndarray) -> int:
    """The first row of a logit lens's top-1 classes (L+1,) from which on the class stays the final one (0: the
    embeddings, l: after block l - 1)."""
    tops = np.asarray(tops)
    return next(layer for layer in range(len(tops)) if (tops[layer:] == tops[-1]).all())
