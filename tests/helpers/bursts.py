"""Traces of burst-tier requests, for properties checked over any model or store."""

from __future__ import annotations

from hypothesis import strategies as st

# (tenant, seconds since the previous request, copies, min_copies)
Trace = list[tuple[str, float, int, int]]

trace_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 5.0]),
        st.integers(0, 6),
        st.integers(0, 6),
    ),
    max_size=40,
)
