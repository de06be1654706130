"""What any detector could reach on the synthetic suite: the oracle's delay.

Some of the issue's delay targets ask for less time than the injected change needs to stand
out of the suite's noise. This measures that for the signals whose delay targets are hardest,
on the suite's own generator and injections: an *oracle* knows the healthy run the event was
injected into, the onset, the exact shape of the change and the noise model (the per-point
standard deviation and the AR(1) coefficient of the loss, the grad norm's log noise, an eval
suite's relative noise). Its best test is the matched filter, whose signal-to-noise ratio
after ``m`` points past the onset is

    SNR(m)² = Σ (μ_i − φ·μ_{i−1})² / (1 − φ²),   μ_i = change_i / sd_i,

the energy of the change after the noise is whitened (``φ = 0`` for independent evaluations).
A detector watching a whole run looks thousands of times, so keeping healthy runs quiet
takes a threshold near 4 standard deviations; at ``SNR = threshold`` it detects half the
time, so the step where ``SNR`` reaches 4 is the oracle's *median* delay. A real detector
knows none of this (it must learn the trend, the noise and the onset from the run itself),
so it can only be later: where the oracle's median is above the target, no detector meets
the target on this suite.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from benchmarks import synthetic as bd

# Each event's oracle delay and its tolerance, in the signal's unit.
_Delays = tuple[np.ndarray, np.ndarray]

THRESHOLD = 4.0  # standard deviations: a detector quiet over thousands of looks
# ... and a lenient one: a detector that accepts false alarms on healthy runs for speed.
LENIENT_THRESHOLD = 3.0
DRAWS = 20  # base runs per profile and strength


def matched_filter_snr(change: np.ndarray, sd: np.ndarray | float, phi: float = 0.0
                       ) -> np.ndarray:
    """The matched filter's signal-to-noise ratio after each point for a known ``change``
    (zero before the event) in AR(1) Gaussian noise with standard deviation ``sd`` per point
    and coefficient ``phi``: the square root of the whitened change's running energy."""
    mu = np.asarray(change, dtype=float) / sd
    # The first point has the noise's whole variance; each later one, given the point
    # before it, the innovations' (1 - phi²).
    innovations = mu - phi * np.concatenate(([0.0], mu[:-1]))
    innovations[:1] *= math.sqrt(1.0 - phi * phi)
    return np.sqrt(np.cumsum(innovations**2) / (1.0 - phi * phi))


def oracle_delay(snr: np.ndarray, onset: int, threshold: float = THRESHOLD) -> float:
    """Points from ``onset`` (0: the onset itself) until ``snr`` first reaches
    ``threshold``; infinite when it never does."""
    reached = np.flatnonzero(snr[onset:] >= threshold)
    return float(reached[0]) if reached.size else float("inf")


@dataclass(frozen=True)
class Bound:
    """The oracle's delays for one kind of event, in the signal's unit, with the target."""

    signal: str
    events: str
    unit: str  # "% of the run" or "evals"
    target: float
    delays: np.ndarray
    tolerance: np.ndarray  # each event's tolerance, in the same unit

    def recall(self) -> float:
        """The share of events the oracle detects (half the time) within their tolerance:
        the recall no detector can beat by much."""
        return float(np.mean(self.delays <= self.tolerance))

    def median(self) -> float:
        return float(np.median(self.delays))

    def p90(self) -> float:
        # "higher": an event the oracle never sees keeps its infinite delay (interpolating
        # between two infinities gives NaN).
        return float(np.percentile(self.delays, 90, method="higher"))

    def within(self) -> float:
        """The share of events the oracle detects (half the time) within the target."""
        return float(np.mean(self.delays <= self.target))


def _step_level(inject: Callable[[bd._Run, str, np.random.Generator], bd.Injected],
                change: Callable[[bd._Run, bd._Run], np.ndarray],
                noise: Callable[[bd._Run], tuple[np.ndarray | float, float]],
                seed: int, threshold: float, floor: Callable[[bd.Event], int] = lambda event: 0
                ) -> _Delays:
    """Oracle delays, in % of the run, of an injection into healthy base runs of every
    profile and strength: ``change(healthy, injected)`` is the change in the series the
    ``noise(healthy)`` model describes; ``floor(event)``: points no detector can do without
    (a swing is periodic only once a period has been seen). Also each event's tolerance."""
    delays, tolerances = [], []
    for p, profile in enumerate(bd.PROFILES):
        for strength in bd.STRENGTHS:
            for k in range(DRAWS):
                rng = np.random.default_rng([seed, p, k])
                healthy = bd.base_run(rng, profile, bd._schedule_for(rng))
                run = copy.deepcopy(healthy)
                events, _ = inject(run, strength, rng)
                onset = int(np.searchsorted(run.steps, events[0].onset))
                sd, phi = noise(healthy)
                snr = matched_filter_snr(change(healthy, run), sd, phi)
                delay = max(oracle_delay(snr, onset, threshold), floor(events[0]))
                delays.append(100.0 * delay / len(run.steps))
                tolerances.append(100.0 * events[0].tolerance / profile.steps)
    return np.asarray(delays), np.asarray(tolerances)


def _loss_change(healthy: bd._Run, run: bd._Run) -> np.ndarray:
    # The noise is multiplicative: the change is in the log of the noise-free loss.
    return np.log(run.clean_loss()) - np.log(healthy.clean_loss())


def _grad_change(healthy: bd._Run, run: bd._Run) -> np.ndarray:
    return np.log(run.grad_norm) - np.log(healthy.grad_norm)


def _period(event: bd.Event) -> int:
    return int(event.variant.removeprefix("period "))


def _forgetting(seed: int, threshold: float) -> _Delays:
    """Oracle delays, in evaluations, of the general suite's fall (the injection's rates,
    depths and noise): the level is known, so every evaluation from the onset counts."""
    rng = np.random.default_rng([seed, 99])
    delays = []
    for strength in bd.STRENGTHS:
        rate, depth = bd.FORGETTING[strength]
        for _ in range(len(bd.PROFILES) * DRAWS):
            sigma = rng.uniform(*bd.GENERAL_NOISE)
            drop = np.minimum(depth, rate * np.arange(1, 40))
            delays.append(oracle_delay(matched_filter_snr(drop, sigma), 0, threshold))
    return np.asarray(delays), np.full(len(delays), float(bd.FORGETTING_TOLERANCE))


_NOISE, _GRAD_NOISE = attrgetter("noise_model"), attrgetter("grad_noise")
# signal → the events, the unit, the target and the oracle's delays for a seed and a
# threshold.
BOUNDED: dict[str, tuple[str, str, float, Callable[[int, float], _Delays]]] = {
    "plateau": ("the loss law at 30/10/0% pace", "% of the run", 2.0,
                lambda seed, threshold: _step_level(bd._inject_plateau, _loss_change, _NOISE,
                                                    seed, threshold)),
    "oscillation": ("±2/4/8% swings, period 10/25/60 points (at least one period)",
                    "% of the run", 2.0,
                    lambda seed, threshold: _step_level(bd._inject_oscillation, _loss_change,
                                                        _NOISE, seed, threshold, _period)),
    "grad_norm": ("climbs to x4/8/30 by the run's end", "% of the run", 2.0,
                  lambda seed, threshold: _step_level(bd._inject_grad_climb, _grad_change,
                                                      _GRAD_NOISE, seed, threshold)),
    "forgetting": ("general suite -0.5/1/3% per evaluation", "evals", 3.0, _forgetting),
}


def bounds(signals: list[str] | None = None, seed: int = 0,
           threshold: float = THRESHOLD) -> list[Bound]:
    """The oracle's delays for the events whose delay targets are hardest to meet (those of
    ``signals`` only, when given), detecting where the whitened change reaches
    ``threshold`` standard deviations."""
    return [Bound(signal, events, unit, target, *_delays(signal, seed, threshold))
            for signal, (events, unit, target, _) in BOUNDED.items()
            if signals is None or signal in signals]


@functools.cache
def _delays(signal: str, seed: int, threshold: float) -> _Delays:
    return BOUNDED[signal][3](seed, threshold)


def found_delays(ours: dict[str, dict], variants: dict[tuple[str, str], dict]
                 ) -> dict[str, float | None]:
    """runwatch's median delay on a scored suite for the events ``BOUNDED`` covers, in the
    bound's unit (``ours`` and ``variants``: summarised results per signal and per
    (signal, variant)); a grad-norm climb's alone, as the bound covers climbs."""
    found: dict[str, float | None] = {}
    for signal, (_, unit, _, _) in BOUNDED.items():
        s = variants.get((signal, "climb")) if signal == "grad_norm" else ours.get(signal)
        if s is None:
            continue
        value = s["median_delay_units"] if unit == "evals" else s["median_delay_share"]
        found[signal] = None if value is None else value * (1 if unit == "evals" else 100)
    return found


def _number(value: float, digits: int = 1) -> str:
    return "never" if not np.isfinite(value) else f"{value:.{digits}f}"


def bound_rows(found: dict[str, float | None] | None = None,
               signals: list[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """The table: per kind of event, the oracle's median and p90 delay, the share of events
    it detects within the target, and runwatch's median delay on the suite
    (``found``: signal → median delay in the same unit, where known)."""
    header = ["signal", "events", "issue target", "oracle median / p90 delay",
              "events within the target (oracle)",
              f"lenient oracle ({LENIENT_THRESHOLD:g}σ): median, within the target",
              "runwatch median delay", "oracle recall within the tolerance"]
    rows = []
    lenient = {b.signal: b for b in bounds(signals, threshold=LENIENT_THRESHOLD)}
    for b in bounds(signals):
        ours = (found or {}).get(b.signal)
        low = lenient[b.signal]
        rows.append([b.signal, b.events, f"≤ {b.target:g} {b.unit}",
                     f"{_number(b.median())} / {_number(b.p90())} {b.unit}",
                     f"{b.within():.0%}", f"{_number(low.median())} {b.unit}, {low.within():.0%}",
                     "–" if ours is None else f"{ours:.1f} {b.unit}", f"{b.recall():.2f}"])
    return header, rows
