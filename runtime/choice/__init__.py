"""Choosing what runs: profiling, refinement, the selector, ladders from profiles."""
