"""The "Registers & norms" tab: token norms, high-norm patches and register tokens (docs/spec/analyses.md,
"Token norms and high-norm tokens"; Darcet et al., ICLR 2024, "Vision Transformers Need Registers").

For one row of the residual stream (the embeddings entering block 0, or the tokens after a block) the tab
shows each patch token's norm over the crop with the high-norm patches framed, the histogram of the patch
norms with the fence that decides "high-norm" and the prefix tokens' norms, the share of the last
block's attention that goes to the marked patches and to the registers, and the high-norm rate of every
row. Like the other views it never runs the model: everything comes from the one cached capture.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import streamlit as st

from dashboard import session, text
from dashboard.figures import base as figures
from dashboard.figures import registers as register_figures
from dashboard.figures.lens import lens_row_name
from dashboard.views.context import ViewContext, cached_figure, column_px, shape, show_picture
from dashboard.views.registry import view
from vit_core import analyses, explain

MAX_LISTED = 12  # high-norm patches named one by one in the text; the rest are counted


def register_keys(prefix_names: tuple[str, ...], num_patches: int) -> np.ndarray:
    """Which tokens are registers: bool (T,), true for the prefix tokens named REG1, REG2, ..."""
    keys = np.zeros(len(prefix_names) + num_patches, dtype=bool)
    keys[:len(prefix_names)] = [name.startswith("REG") for name in prefix_names]
    return keys


def patch_keys(high_norm_row: np.ndarray, num_prefix_tokens: int) -> np.ndarray:
    """The chosen patches as keys of the attention: high_norm_row bool (N,) -> bool (T,), prefix tokens false."""
    return np.concatenate([np.zeros(num_prefix_tokens, dtype=bool), high_norm_row])


def _where(row: int) -> str:
    """Row `row` of the residual stream as a phrase that follows a noun: 'in the embeddings', 'after block 3'."""
    return "in the embeddings" if row == 0 else lens_row_name(row)


def _norm_map_image(ctx: ViewContext, row: int, encoding: str) -> bytes:
    """Row `row`'s patch-token norms over the crop, high-norm patches framed."""
    g, cap = ctx.loaded.geometry, ctx.cap
    norms = explain.token_norms(cap, row)  # (T,)
    high = analyses.high_norm_patches(norms, g.num_prefix_tokens).reshape(g.grid)  # (T,) -> (N,) -> (gh, gw)
    norm_map = norms[g.num_prefix_tokens:].reshape(g.grid)  # (N,) -> (gh, gw)
    return figures.encode(register_figures.norm_map_image(cap.input_image, norm_map, high, g.patch_size), encoding)


def _token_norms_png(ctx: ViewContext, row: int) -> bytes:
    g = ctx.loaded.geometry
    norms = explain.token_norms(ctx.cap, row)  # (T,)
    patch_norms = norms[g.num_prefix_tokens:]  # (N,)
    return register_figures.token_norms_png(patch_norms, float(analyses.high_norm_fence(patch_norms)),
                                            norms[:g.num_prefix_tokens], g.prefix_names,
                                            width_px=column_px(REGISTER_COLUMNS, 1) - 20)


def _rate_png(ctx: ViewContext) -> bytes:
    """The high-norm rate of every row: built once per image (every row's norms), whatever row is shown."""
    rate = analyses.high_norm_rate(explain.token_norms(ctx.cap), ctx.loaded.geometry.num_prefix_tokens)  # (L+1,)
    return register_figures.high_norm_rate_png(rate, title=f"high-norm patch tokens per layer {shape(rate.shape, batch=False)}",
                                               width_px=column_px(REGISTER_COLUMNS, 1) - 20)


REGISTER_COLUMNS = [1, 1]  # the norms over the crop, then the histogram and the text


@view("Registers & norms", family="research", order=30)
def registers_view(ctx: ViewContext) -> None:
    g = ctx.loaded.geometry
    _norms_at_layer(ctx)
    st.markdown(text.REGISTERS)
    registers = [name for name in g.prefix_names if name.startswith("REG")]
    if registers:
        st.markdown(text.HAS_REGISTERS.format(count=len(registers), names=", ".join(registers)))
    else:
        prefix = f"its prefix tokens: {', '.join(g.prefix_names)}" if g.prefix_names else "and no prefix tokens at all"
        st.markdown(text.NO_REGISTERS.format(prefix=prefix))
    st.markdown(text.REGISTERS_WHY)


def _high_norm_text(g, high_row: np.ndarray, fence: float) -> str:
    """The high-norm patches of one row, by name: 'patch 37 (row 2, col 9), ...' (the first MAX_LISTED)."""
    marked = np.flatnonzero(high_row)
    if not len(marked):
        return f"**No** patch token exceeds the fence ({fence:.3g}) here."
    names = [g.token_name(g.num_prefix_tokens + int(k)) for k in marked[:MAX_LISTED]]
    more = f", and {len(marked) - MAX_LISTED} more" if len(marked) > MAX_LISTED else ""
    return (f"**{len(marked)}** of {g.num_patches} patch tokens exceed the fence ({fence:.3g}): "
            + ", ".join(names) + more + ".")


@st.fragment
def _norms_at_layer(ctx: ViewContext) -> None:
    g, cap = ctx.loaded.geometry, ctx.cap
    p = g.num_prefix_tokens
    left, right = st.columns(REGISTER_COLUMNS)
    row = right.select_slider("Tokens of", list(range(g.num_layers + 1)), value=g.num_layers, key=session.K_NORM_LAYER,
                              format_func=lens_row_name, bind="query-params",
                              help="the residual stream: the embeddings entering block 0, then the tokens after each block")
    norms = explain.token_norms(cap, row)  # (T,)
    high = analyses.high_norm_patches(norms, p)  # (T,) -> (N,): it takes one row as well as all
    patch_norms = norms[p:]  # (N,)
    fence = float(analyses.high_norm_fence(patch_norms))
    with left:
        show_picture(cached_figure(_norm_map_image, ctx, row, "jpeg"), "norm_map", f"{ctx.stem}_token_norms_{row}",
                     caption=f"patch-token norms {_where(row)} over the crop (min-max scaled); "
                             "green frames: high-norm", png=partial(_norm_map_image, ctx, row, "png"))
    with right:
        show_picture(cached_figure(_token_norms_png, ctx, row), "norm_hist", f"{ctx.stem}_norm_histogram_{row}",
                     caption=f"token norms {_where(row)}")
        st.markdown(_high_norm_text(g, high, fence))
        if p:
            median = float(np.median(patch_norms))
            st.markdown("| token | norm | x median patch norm |\n| --- | --- | --- |\n" + "\n".join(
                f"| {name} | {norms[i]:.3g} | {norms[i] / median:.3g} |" for i, name in enumerate(g.prefix_names))
                + f"\n| median patch | {median:.3g} | 1 |")
    shares, rates = st.columns(REGISTER_COLUMNS)
    with shares:
        _attention_shares(ctx, high, row)
    with rates:
        show_picture(cached_figure(_rate_png, ctx), "norm_rate", f"{ctx.stem}_high_norm_rate")
        st.caption(text.RATE_NOTE)
    st.caption(f"tokens `{shape(cap.tokens.shape, batch=False)}` (rows: the embeddings, then after each block; tokens; "
               f"width) -> norms `{shape(cap.tokens.shape[:2], batch=False)}`; this row's patch norms "
               f"`{shape(patch_norms.shape, batch=False)}` -> the map `{shape(g.grid, batch=False)}`; "
               f"the last block's attention `{shape(cap.pattern[-1].shape)}` (heads, queries, keys).")


def _attention_shares(ctx: ViewContext, high_row: np.ndarray, row: int) -> None:
    """The share of the last block's attention (mean over heads and all queries) that goes to the marked
    patches, to the registers and to the class token, each beside what uniform attention would give."""
    g = ctx.loaded.geometry
    last = ctx.cap.pattern[-1]  # (H, T, T)
    groups = [("Marked patches", patch_keys(high_row, g.num_prefix_tokens))]
    registers = register_keys(g.prefix_names, g.num_patches)
    if registers.any():
        groups.append(("Registers", registers))
    if g.has_class_token:
        groups.append(("Class token", np.arange(g.num_tokens) == g.prefix_names.index("CLS")))
    st.markdown(f"**Where the last block (block {g.num_layers - 1}) looks**: the share of its attention that goes to "
                f"each group of keys, averaged over its {g.num_heads} heads and all {g.num_tokens} queries. Marked "
                f"patches: those high-norm {_where(row)}.")
    for (name, keys), col in zip(groups, st.columns(len(groups)), strict=True):
        share = analyses.attention_share_to(last, keys)
        col.metric(name, f"{share:.1%}",
                   help=f"{int(keys.sum())} of {g.num_tokens} keys; uniform attention would give "
                        f"{keys.sum() / g.num_tokens:.1%}")
        col.caption(f"{int(keys.sum())} token(s); uniform attention: {keys.sum() / g.num_tokens:.1%}")
