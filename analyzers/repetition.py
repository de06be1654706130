"""Repetition: logged sample generations repeat themselves (repeated n-grams, low distinct-n)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzers import register
from analyzers.base import (
    Analyzer,
    Finding,
    RunData,
    check_int,
    check_metric,
    check_real,
    checkpoint_at_or_before,
)
from analyzers.stats import (
    Episode,
    episode_steps,
    excerpt,
    judged_episodes,
    judged_evaluations,
    share,
    shown_evaluations,
    tokens,
)

# Evaluations shown in the evidence: the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30
# Characters of an output that are judged: a loop shows long before, and an output that ran
# to its token limit must not make a poll slow.
_MAX_CHARS = 10_000


@dataclass(frozen=True)
class _Evaluation:
    step: int
    rate: float  # mean repeated n-gram rate of the judged outputs
    distinct_2: float  # distinct bigrams / bigrams over all the evaluation's outputs
    outputs: int  # outputs judged
    worst: tuple[str, str, float]  # prompt, output and rate of the most repetitive output


@register
class Repetition(Analyzer):
    """Repetition: the model's sample generations loop over the same words and phrases.

    *Signal* (SIGNALS.md ``repetition``; over ``RunData.generations``). Each output is
    cut into tokens (words; each CJK or kana character is a token, those scripts not
    separating words by spaces) and its *repeated n-gram rate* is the share of its
    ``n``-grams that repeat an earlier one (0 for varied text, near 1 for a loop). An
    evaluation (the outputs logged at one step) is judged by the mean rate of its outputs;
    its distinct-2 (distinct bigrams over all its outputs, low for templated answers) is
    reported beside it. The first judged evaluation is the baseline. An evaluation is bad
    when its rate exceeds ``threshold`` and the baseline's by ``margin``; after
    ``patience`` bad evaluations in a row the finding fires, its onset at the first. It
    resolves once the rate is back at least halfway to the baseline. The rollback target
    is the latest checkpoint at or before the last good evaluation (SFT repetition is
    mostly over-training: the earlier weights did not repeat).

    Parameters
    ----------
    metric : str, default "generations/repetition"
        The metric label the findings carry.
    n : int, default 4
        The n-gram length. Shorter also counts natural repeats ("of the"); longer only
        counts loops of whole phrases.
    threshold : float, default 0.2
        Mean repeated n-gram rate above which an evaluation can be bad. Varied prose
        rarely exceeds 0.05 at n = 4; lower also reports list-like answers that
        legitimately repeat a phrase.
    margin : float, default 0.1
        How far (absolute) the rate must also exceed the first evaluation's. It keeps a
        task whose answers repeat by nature (tables, code) from firing; lower reports a
        smaller degradation.
    patience : int, default 2
        Bad evaluations in a row before firing. More rides out one unlucky sample of
        prompts; fewer alerts an evaluation sooner.
    min_outputs : int, default 5
        Outputs with at least two n-grams an evaluation needs to be judged; an evaluation
        with fewer is skipped. Lower judges tiny samples whose rate is mostly luck.

    *False-positive guard*: ``margin`` compares the run with its own first evaluation, so
    a task that repeats by nature does not fire; ``min_outputs`` (short outputs carry no
    n-grams and are not judged) and ``patience`` ask for a sustained, well-sampled rise.
    Only the first 10,000 characters of an output are read.
    There is no warm-up exclusion: generations are logged at evaluations, and the first
    is the baseline. The resolve level (halfway back to the baseline) is below the firing
    one, so a rate at the edge does not flap.

    Examples
    --------
    >>> from analyzers import Checkpoint, RunData
    >>> words = "the model answers every question with fresh and varied words".split()
    >>> def varied(i):
    ...     return " ".join(words[(i + k) % len(words)] for k in range(10)) + f" case {i}"
    >>> rows = [{"step": s, "prompt": f"q{i}", "output": varied(i)}
    ...         for s in (100, 200, 300) for i in range(8)]
    >>> rows += [{"step": s, "prompt": f"q{i}", "output": "I am sorry " * 6}
    ...          for s in (400, 500) for i in range(8)]
    >>> data = RunData.from_series("demo", {}, generations=rows,
    ...                            checkpoints=[Checkpoint(250, "ckpt/checkpoint-250")])
    >>> [finding] = Repetition().detect(data)
    >>> finding.onset_step, finding.detected_step, finding.rollback_to.step
    (400, 500, 250)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    mean repeated 4-gram rate of 8 sample generations 80% at step 500 (first evaluation 0%
    at step 100; threshold 20%, margin +10 points), for 2 evaluations in a row; distinct-2
    0.30 → 0.02
    """

    signal = "repetition"

    def __init__(self, metric: str = "generations/repetition", n: int = 4,
                 threshold: float = 0.2, margin: float = 0.1, patience: int = 2,
                 min_outputs: int = 5) -> None:
        check_metric(metric)
        check_int("n", n, 1)
        check_real("threshold", threshold, 0.0, allow_equal=True, below=1.0)
        check_real("margin", margin, 0.0, allow_equal=True, below=1.0)
        check_int("patience", patience, 1)
        check_int("min_outputs", min_outputs, 1)
        self.metric = metric
        self.n = n
        self.threshold = threshold
        self.margin = margin
        self.patience = patience
        self.min_outputs = min_outputs

    def detect(self, data: RunData) -> list[Finding]:
        judged = judged_evaluations(data.generations, self._evaluate)
        return [self._finding(data, judged, episode)
                for episode in judged_episodes(judged, floor=self.threshold,
                                               margin=self.margin, patience=self.patience)]

    def _evaluate(self, step: int, prompts: list[str], outputs: list[str]) -> _Evaluation | None:
        rates: list[float] = []
        worst = ("", "", -1.0)
        bigrams: list[tuple[str, ...]] = []
        for prompt, output in zip(prompts, outputs, strict=True):
            words = tokens(output[:_MAX_CHARS])
            bigrams += _ngrams(words, 2)
            grams = _ngrams(words, self.n)
            if len(grams) < 2:
                continue
            rate = 1.0 - len(set(grams)) / len(grams)
            rates.append(rate)
            if rate > worst[2]:
                worst = (prompt, output, rate)
        if len(rates) < self.min_outputs:
            return None
        distinct = len(set(bigrams)) / len(bigrams) if bigrams else 1.0
        return _Evaluation(step, float(np.mean(rates)), distinct, len(rates), worst)

    def _finding(self, data: RunData, judged: list[_Evaluation], episode: Episode) -> Finding:
        first, fired = judged[0], judged[episode.fired]
        good = judged[episode.onset - 1]  # the baseline is never bad: onset >= 1
        summary = (f"mean repeated {self.n}-gram rate of {fired.outputs} sample generations "
                   f"{share(fired.rate)} at step {fired.step} (first evaluation "
                   f"{share(first.rate)} at step {first.step}; threshold {share(self.threshold)}, "
                   f"margin +{100 * self.margin:g} points), for "
                   f"{episode.fired - episode.onset + 1} evaluations in a row; distinct-2 "
                   f"{first.distinct_2:.2f} → {fired.distinct_2:.2f}")
        prompt, output, rate = fired.worst
        shown = shown_evaluations(judged, episode, _MAX_EVIDENCE_POINTS)
        evidence = {
            "n": self.n,
            "threshold": self.threshold,
            "margin": self.margin,
            "baseline_step": first.step,
            "baseline_rate": first.rate,
            "rate": fired.rate,
            "distinct_2": fired.distinct_2,
            "example": {"step": fired.step, "prompt": excerpt(prompt),
                        "output": excerpt(output), "rate": rate},
            "evaluations": [[e.step, e.rate, e.distinct_2, e.outputs] for e in shown],
        }
        return self.finding(
            data, summary=summary, evidence=evidence, **episode_steps(judged, episode),
            rollback_to=checkpoint_at_or_before(
                data.checkpoints, good.step,
                f"latest checkpoint at or before step {good.step}, the last evaluation whose "
                f"generations did not repeat ({share(good.rate)})"))


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return list(zip(*(words[i:] for i in range(n)), strict=False))
