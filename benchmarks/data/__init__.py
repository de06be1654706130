"""Labelled data the benchmarks read (the synthetic corpus labels)."""
