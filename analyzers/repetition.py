"""Repetition: logged sample generations repeat themselves (repeated n-grams, low distinct-n)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, RunData, checkpoint_at_or_before
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import share
from analyzers.stats.text import episode_steps, excerpt, shown_evaluations, tokens
from analyzers.stats.trend import Episode, RateJudgement, judge_rates, rate_episodes
from analyzers.streaming import EvaluationCache, Streams, cached_evaluations

# Evaluations shown in the evidence: the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30
# Characters of an output that are judged: a loop shows long before, and an output that ran
# to its token limit must not make a poll slow.
_MAX_CHARS = 10_000


@dataclass(frozen=True)
class _Evaluation:
    step: int
    rate: float  # share of the judged outputs that loop
    loops: int  # outputs that loop
    outputs: int  # outputs judged
    mean_rate: float  # mean repeated n-gram rate of the judged outputs
    distinct_2: float  # distinct bigrams / bigrams over all the evaluation's outputs
    worst: tuple[str, str, float]  # prompt, output and rate of the most repetitive output


@register
class Repetition(Analyzer):
    """Repetition: the model's sample generations loop over the same words and phrases.

    *Signal* (SIGNALS.md ``repetition``; over ``RunData.generations``). Each output is
    cut into tokens (words; each CJK or kana character is a token, those scripts not
    separating words by spaces) and its *repeated n-gram rate* is the share of its
    ``n``-grams that repeat an earlier one (0 for varied text, near 1 for a loop); an
    output whose rate reaches ``loop_rate`` *loops*. An evaluation (the outputs logged at
    one step) is judged by the share of its outputs that loop; their mean rate and its
    distinct-2 (distinct bigrams over all its outputs, low for templated answers) are
    reported beside it. The baseline pools the first ``baseline`` evaluations that were not
    bad (the first one alone is never judged). An evaluation is bad when its looping share
    exceeds ``threshold`` and the baseline's share by ``margin``, *and* a one-sided Fisher
    exact test finds more looping outputs than the baseline's at level ``alpha`` (so a
    handful of outputs against a small baseline is not enough); after ``patience`` bad
    evaluations in a row the finding fires, its onset at the first. It resolves after
    ``patience`` evaluations in a row with the share back at least halfway to the
    baseline's. The rollback target is the latest checkpoint at or before the last good
    evaluation (SFT repetition is mostly over-training: the earlier weights did not
    repeat).

    Parameters
    ----------
    metric : str, default "generations/repetition"
        The metric label the findings carry.
    n : int, default 4
        The n-gram length. Shorter also counts natural repeats ("of the"); longer only
        counts loops of whole phrases.
    loop_rate : float, default 0.2
        Repeated n-gram rate from which an output loops. Varied prose rarely reaches 0.05
        at n = 4 (about 1% of prose paragraphs reach 0.2); a phrase repeated over the last
        half of an answer gives 0.2–0.9. Lower also counts answers that quote a phrase
        several times (links, tables); higher only counts outputs that are mostly loop.
    threshold : float, default 0.2
        Share of looping outputs above which an evaluation can be bad (one output in five
        degenerate). Lower reports rarer loops; higher only a model that loops on most
        prompts.
    margin : float, default 0.1
        How far (absolute) the share must also exceed the baseline's. It keeps a task whose
        answers repeat by nature (tables, code) from firing; lower reports a smaller
        degradation.
    patience : int, default 2
        Bad evaluations in a row before firing, and calm ones in a row before resolving.
        More rides out one unlucky sample of prompts; fewer alerts an evaluation sooner.
    min_outputs : int, default 5
        Outputs with at least two n-grams an evaluation needs to be judged; an evaluation
        with fewer is skipped. Lower judges tiny samples whose rate is mostly luck.
    baseline : int, default 3
        Evaluations pooled into the baseline (the first ones that were not bad). More
        estimates a task's natural share of looping outputs better; the first alone is
        one sample of prompts.
    alpha : float, default 0.01
        Significance of the Fisher test against the baseline. Lower needs more looping
        outputs when the baseline has some or few outputs were sampled; higher lets a
        task's natural wobble in looping answers through.

    *False-positive guard*: ``margin`` compares the run with its own baseline, so a task
    that repeats by nature does not fire, and the Fisher test asks that the rise be more
    than the sampling noise of both the evaluation and the baseline (a binomial test
    against the baseline's share alone would take its estimate for exact);
    ``min_outputs`` (short outputs carry no n-grams and are not judged) and ``patience``
    ask for a sustained, well-sampled rise. Only the first 10,000 characters of an output
    are read. There is no warm-up exclusion: generations are logged at evaluations, and
    the first ones are the baseline. The resolve level (halfway back to the baseline) is
    below the firing one and must hold ``patience`` evaluations, so a share at the edge
    does not flap.

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
    8 of 8 sample generations loop (repeated 4-gram rate ≥ 20%) at step 500: 100% against
    0% over the 3 baseline evaluations to step 300 (threshold 20%, margin +10 points;
    Fisher p < 0.0001), for 2 evaluations in a row; mean repeated 4-gram rate 0% → 80%,
    distinct-2 0.30 → 0.02
    """

    signal = "repetition"

    def __init__(self, metric: str = "generations/repetition", n: int = 4,
                 loop_rate: float = 0.2, threshold: float = 0.2, margin: float = 0.1,
                 patience: int = 2, min_outputs: int = 5, baseline: int = 3,
                 alpha: float = 0.01) -> None:
        check_metric(metric)
        check_int("n", n, 1)
        check_real("loop_rate", loop_rate, 0.0, below=1.0)
        check_real("threshold", threshold, 0.0, allow_equal=True, below=1.0)
        check_real("margin", margin, 0.0, allow_equal=True, below=1.0)
        check_int("patience", patience, 1)
        check_int("min_outputs", min_outputs, 1)
        check_int("baseline", baseline, 1)
        check_real("alpha", alpha, 0.0, below=1.0)
        self.metric = metric
        self.n = n
        self.loop_rate = loop_rate
        self.threshold = threshold
        self.margin = margin
        self.patience = patience
        self.min_outputs = min_outputs
        self.baseline = baseline
        self.alpha = alpha
        self._streams: Streams[EvaluationCache] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        judged = cached_evaluations(self._streams, data, self._evaluate,
                                    (self.n, self.loop_rate, self.min_outputs))
        verdicts = judge_rates([(e.step, e.loops, e.outputs) for e in judged],
                               floor=self.threshold, margin=self.margin, alpha=self.alpha,
                               baseline=self.baseline)
        return [self._finding(data, judged, verdicts, episode)
                for episode in rate_episodes(verdicts, self.patience)]

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
        loops = sum(r >= self.loop_rate for r in rates)
        distinct = len(set(bigrams)) / len(bigrams) if bigrams else 1.0
        return _Evaluation(step, loops / len(rates), loops, len(rates), float(np.mean(rates)),
                           distinct, worst)

    def _finding(self, data: RunData, judged: list[_Evaluation], verdicts: list[RateJudgement],
                 episode: Episode) -> Finding:
        first, fired, verdict = judged[0], judged[episode.fired], verdicts[episode.fired]
        good = judged[episode.onset - 1]  # the first evaluation is never bad: onset >= 1
        summary = (f"{fired.loops} of {fired.outputs} sample generations loop (repeated "
                   f"{self.n}-gram rate ≥ {share(self.loop_rate)}) at step {fired.step}: "
                   f"{share(fired.rate)} against {verdict.baseline_text} "
                   f"(threshold {share(self.threshold)}, margin +{100 * self.margin:g} "
                   f"points; Fisher {verdict.p_text}), for {episode.fired - episode.onset + 1} "
                   f"evaluations in a row; mean repeated {self.n}-gram rate "
                   f"{share(first.mean_rate)} → {share(fired.mean_rate)}, distinct-2 "
                   f"{first.distinct_2:.2f} → {fired.distinct_2:.2f}")
        prompt, output, rate = fired.worst
        shown = shown_evaluations(judged, episode, _MAX_EVIDENCE_POINTS)
        evidence = {
            "n": self.n,
            "loop_rate": self.loop_rate,
            "threshold": self.threshold,
            "margin": self.margin,
            "alpha": self.alpha,
            "baseline_steps": [first.step, verdict.last_step],
            "baseline_share": verdict.rate,
            "baseline_outputs": verdict.outputs,
            "share": fired.rate,
            "loops": fired.loops,
            "outputs": fired.outputs,
            "p_value": verdict.p_value,
            "mean_rate": fired.mean_rate,
            "distinct_2": fired.distinct_2,
            "example": {"step": fired.step, "prompt": excerpt(prompt),
                        "output": excerpt(output), "rate": rate},
            "evaluations": [[e.step, e.rate, e.mean_rate, e.distinct_2, e.outputs]
                            for e in shown],
        }
        return self.finding(
            data, summary=summary, evidence=evidence, **episode_steps(judged, episode),
            rollback_to=checkpoint_at_or_before(
                data.checkpoints, good.step,
                f"latest checkpoint at or before step {good.step}, the last evaluation whose "
                f"generations did not repeat ({share(good.rate)} looped)"))


def _ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return list(zip(*(words[i:] for i in range(n)), strict=False))
