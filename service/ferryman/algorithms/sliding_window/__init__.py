"""The sliding-window counter: two fixed windows, the previous one weighted by how much of
it the sliding window still covers."""
