"""Measurements several analyzers share, by kind: :mod:`~analyzers.stats.robust` (noise and
levels), :mod:`~analyzers.stats.trend` (trend tests, episodes, rate tests),
:mod:`~analyzers.stats.metric` (what a metric's name and numbers mean) and
:mod:`~analyzers.stats.text` (logged sample generations). Each is a pure function of arrays
or frames; nothing here knows about a signal.
"""
