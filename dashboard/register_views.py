"""The "Registers & norms" tab: token norms, high-norm patches and register tokens (Darcet et al., ICLR 2024)."""

from __future__ import annotations

import streamlit as st

from dashboard.view_context import ViewContext


def registers_view(ctx: ViewContext) -> None:
    st.markdown("**Registers and high-norm tokens**")
