"""Role confusion: the model writes the user's turn, or role markers, in its own answers."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from analyzers import register
from analyzers.base import Analyzer, RunData, checkpoint_at_or_before
from analyzers.checks import check_int, check_metric, check_real
from analyzers.finding import Finding
from analyzers.fmt import share
from analyzers.stats.text import episode_steps, example_evidence, shown_evaluations
from analyzers.stats.trend import Episode, episodes
from analyzers.streaming import EvaluationCache, Streams, cached_evaluations

# Markers of a user turn, matched case-insensitively anywhere in an output (``^`` at a line
# start). One per chat format; teams add their template's own through ``patterns``.
DEFAULT_PATTERNS: tuple[str, ...] = (
    r"<\|im_start\|>\s*user",  # ChatML: Qwen, Yi, OpenHermes
    r"<\|start_header_id\|>\s*user",  # Llama 3
    r"<start_of_turn>\s*user",  # Gemma
    r"<\|user\|>",  # Zephyr, Phi-3, ChatGLM3
    r"<｜User｜>",  # DeepSeek (full-width bars)
    r"\[INST\]",  # Llama 2, Mistral
    r"<\|prompter\|>",  # OpenAssistant
    r"<human>\s*:",  # RedPajama-INCITE
    r"^[ \t]*#{2,4}[ \t]*(?:Instruction|Human|User)\b",  # Alpaca, Vicuna: "### Instruction:"
    r"^[ \t]*(?:User|Human)[ \t]*:",  # plain transcripts: "User:", "Human:"
    r"^[ \t]*(?:用户|用戶|问|問)[ \t]*[:：]",  # Chinese transcripts: "用户：", "问："
)
# Fenced code blocks: an answer that explains a chat template quotes its markers there.
_CODE_BLOCK = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
# Evaluations shown in the evidence: the last ones up to the detection.
_MAX_EVIDENCE_POINTS = 30


@dataclass(frozen=True)
class _Evaluation:
    step: int
    rate: float  # share of outputs with a user-turn marker
    confused: int
    outputs: int
    markers: Counter[str]  # marker text as written → outputs
    example: tuple[str, str] | None  # prompt and output of the first confused output


@register
class RoleConfusion(Analyzer):
    """Role confusion: the model answers for the user.

    *Signal* (SIGNALS.md ``role_confusion``; over ``RunData.generations``). An output is
    *confused* when it contains a user-turn marker from ``patterns`` (see
    :data:`DEFAULT_PATTERNS`: ChatML ``<|im_start|>user``, Llama 3, Gemma, ``<|user|>``,
    ``[INST]``, Alpaca's ``### Instruction``, transcript lines such as ``User:``,
    ``Human:``, ``用户：``). The rate of an evaluation (the outputs logged at one step) is
    the share of confused outputs. The finding fires after ``patience`` evaluations in a
    row that each have a confused output and whose pooled rate exceeds ``threshold``
    (pooling doubles a small sample: 1 of 20 then 2 of 20 is 7.5%, though 1 of 20 alone
    is not above 5%), its onset at the first of them that is not *calm* (rate at most
    half the threshold: a calm evaluation, such as the one that resolved the previous
    finding, is not where the confusion began). It resolves on a run of calm
    evaluations in a row, at least ``patience`` of them, whose pooled outputs show the
    rate is below the threshold: a one-sided exact binomial test, the chance of so few
    confused outputs among them were the rate at the threshold, is under ``alpha`` (5%
    threshold, 1%: 90 clean outputs in a row, e.g. 5 evaluations of 20). A rate that
    stays a little above the threshold often has one evaluation without a confused
    output; that is not the end of the episode. The rollback target is the latest
    checkpoint at or before the evaluation before the onset, when there is one (a
    template error present from the first evaluation is not undone by rolling back).

    Parameters
    ----------
    metric : str, default "generations/role_confusion"
        The metric label the findings carry.
    patterns : tuple of str, default DEFAULT_PATTERNS
        Regular expressions of user-turn markers, matched case-insensitively; ``^`` and
        ``$`` match at line boundaries. Replace them to match your chat template: a
        marker the list lacks is never seen, and a pattern as loose as ``User`` alone
        counts every answer that mentions a user.
    threshold : float, default 0.05
        Share of confused outputs (pooled over ``patience`` evaluations) above which the
        finding fires (0.05 = 5%). Lower reports a rare slip; higher waits until it is
        common.
    patience : int, default 2
        Evaluations in a row, each with a confused output, pooled before firing. More
        rides out one unlucky sample and pools a larger one; fewer alerts an evaluation
        sooner.
    min_outputs : int, default 5
        Outputs an evaluation needs to be judged; one with fewer is skipped (one
        confused output of three is not a rate).
    alpha : float, default 0.01
        Significance of the resolve test. Higher resolves sooner after a fix but lets
        a lasting low rate resolve and fire again by chance (a 10% rate shows 60 clean
        outputs in a row 0.2% of the time, 90 in a row 0.01%); lower waits longer.
        With ``threshold`` 0 the test cannot pass and ``patience`` calm evaluations
        resolve.

    *False-positive guard*: markers inside fenced code blocks are not counted (an answer
    that explains a chat template quotes them), and transcript markers count only at
    the start of a line, not in prose that mentions a user; ``min_outputs`` and
    ``patience`` ask for a sustained, well-sampled rate (one evaluation full of confused
    outputs beside a clean one does not fire). There is no warm-up exclusion:
    any confusion in logged generations is worth reading. The resolve level (half the
    threshold) is below the firing one and must hold until the test shows the rate under
    the threshold, so a rate at the edge does not flap (resolve and fire again).

    Examples
    --------
    >>> from analyzers import RunData
    >>> rows = [{"step": s, "prompt": f"question {i}", "output": f"Here is answer {i}."}
    ...         for s in (100, 200, 300, 400) for i in range(10)]
    >>> for s in (300, 400):
    ...     rows += [{"step": s, "prompt": f"request {i}", "output": "Sure.\\nUser: thanks!"}
    ...              for i in range(3)]
    >>> [finding] = RoleConfusion().detect(RunData.from_series("demo", {}, generations=rows))
    >>> finding.onset_step, finding.detected_step, finding.state, finding.rollback_to
    (300, 400, 'firing', None)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    3 of 13 sample generations (23%) at step 400 write the user's turn (a user-turn marker)
    (threshold 5%), for 2 evaluations in a row; most often 'User:'

    Fixed at step 500: 10 clean outputs an evaluation, and the 90th in a row comes at 1300.

    >>> rows += [{"step": s, "prompt": f"question {i}", "output": "Fine."}
    ...          for s in range(500, 1400, 100) for i in range(10)]
    >>> [finding] = RoleConfusion().detect(RunData.from_series("demo", {}, generations=rows))
    >>> finding.state, finding.resolved_step
    ('resolved', 1300)
    """

    signal = "role_confusion"

    def __init__(self, metric: str = "generations/role_confusion",
                 patterns: tuple[str, ...] = DEFAULT_PATTERNS, threshold: float = 0.05,
                 patience: int = 2, min_outputs: int = 5, alpha: float = 0.01) -> None:
        check_metric(metric)
        self._compiled = _compile(patterns)
        check_real("threshold", threshold, 0.0, allow_equal=True, below=1.0)
        check_int("patience", patience, 1)
        check_int("min_outputs", min_outputs, 1)
        check_real("alpha", alpha, 0.0, below=1.0)
        self.metric = metric
        self.patterns = patterns
        self.threshold = threshold
        self.patience = patience
        self.min_outputs = min_outputs
        self.alpha = alpha
        self._streams: Streams[EvaluationCache] = Streams()

    def detect(self, data: RunData) -> list[Finding]:
        judged = cached_evaluations(
            self._streams, data, self._evaluate,
            (tuple(p.pattern for p in self._compiled), self.min_outputs))
        if len(judged) < self.patience:
            return []
        # Fires at the end of a window of ``patience`` evaluations that each have a
        # confused output and whose pooled rate exceeds the threshold; onset at its first
        # evaluation that is not calm (a calm one, such as the one that resolved the last
        # episode, counts toward resolving, not toward confusion; the pooled rate above
        # the threshold puts one above half of it in every window).
        calm = np.array([e.rate <= self.threshold / 2 for e in judged])
        fires = np.zeros(len(judged), dtype=bool)
        for i in range(self.patience - 1, len(judged)):
            window = judged[i + 1 - self.patience:i + 1]
            fires[i] = (all(e.confused for e in window) and sum(e.confused for e in window)
                        > self.threshold * sum(e.outputs for e in window))
        found = []
        for e in episodes(fires, self._settled(judged, calm), 1):
            start = e.fired + 1 - self.patience
            onset = start + int(np.argmin(calm[start:e.fired + 1]))  # the first not calm
            found.append(self._finding(data, judged, Episode(onset, e.fired, e.resolved)))
        return found

    def _settled(self, judged: list[_Evaluation], calm: np.ndarray) -> np.ndarray:
        """Whether each evaluation ends a run of ``calm`` ones (rate at most half the
        threshold), at least ``patience`` long, whose pooled outputs reject a rate at the
        threshold (one-sided exact binomial test at ``alpha``)."""
        settled = np.zeros(len(judged), dtype=bool)
        length = confused = outputs = 0
        for i, e in enumerate(judged):
            if not calm[i]:
                length = confused = outputs = 0
                continue
            length, confused, outputs = length + 1, confused + e.confused, outputs + e.outputs
            settled[i] = length >= self.patience and (
                self.threshold == 0
                or _binomial_at_most(confused, outputs, self.threshold) < self.alpha)
        return settled

    def markers(self, output: str) -> list[str]:
        """The user-turn markers in one output, as written, outside code blocks."""
        prose = _CODE_BLOCK.sub(" ", output)
        return [m.group(0).strip() for pattern in self._compiled
                for m in [pattern.search(prose)] if m is not None]

    def _evaluate(self, step: int, prompts: list[str], outputs: list[str]) -> _Evaluation | None:
        if len(outputs) < self.min_outputs:
            return None
        confused = 0
        markers: Counter[str] = Counter()
        example = None
        for prompt, output in zip(prompts, outputs, strict=True):
            found = self.markers(output)
            if found:
                confused += 1
                markers.update(set(found))
                example = example or (prompt, output)
        return _Evaluation(step, confused / len(outputs), confused, len(outputs), markers,
                           example)

    def _finding(self, data: RunData, judged: list[_Evaluation], episode: Episode) -> Finding:
        fired = judged[episode.fired]
        good = judged[episode.onset - 1] if episode.onset > 0 else None
        run = episode.fired - episode.onset + 1
        summary = (f"{fired.confused} of {fired.outputs} sample generations "
                   f"({share(fired.rate)}) at step {fired.step} write the user's turn (a "
                   f"user-turn marker) (threshold {100 * self.threshold:g}%), for {run} "
                   f"evaluation{'s' if run > 1 else ''} in a row")
        if fired.markers:
            summary += f"; most often {fired.markers.most_common(1)[0][0]!r}"
        shown = shown_evaluations(judged, episode, _MAX_EVIDENCE_POINTS)
        evidence = {
            "threshold": self.threshold,
            "rate": fired.rate,
            "confused": fired.confused,
            "outputs": fired.outputs,
            "markers": dict(fired.markers.most_common(10)),
            "example": example_evidence(fired.step, fired.example),
            "evaluations": [[e.step, e.rate, e.confused, e.outputs] for e in shown],
        }
        return self.finding(
            data, summary=summary, evidence=evidence, **episode_steps(judged, episode),
            rollback_to=None if good is None else checkpoint_at_or_before(
                data.checkpoints, good.step,
                f"latest checkpoint at or before step {good.step}, the last evaluation whose "
                f"generations kept to their role ({share(good.rate)} confused)"))


def _compile(patterns: object) -> list[re.Pattern[str]]:
    if isinstance(patterns, str) or not isinstance(patterns, (tuple, list)) or not patterns:
        raise ValueError(f"patterns must be a non-empty list of regular expressions, "
                         f"got {patterns!r}")
    compiled = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"patterns: {pattern!r} is not a regular expression")
        try:
            compiled.append(re.compile(pattern, re.IGNORECASE | re.MULTILINE))
        except re.error as exc:
            raise ValueError(f"patterns: {pattern!r} is not a valid regular expression "
                             f"({exc})") from None
    return compiled


def _binomial_at_most(k: int, n: int, p: float) -> float:
    """The chance of ``k`` or fewer successes in ``n`` trials of probability ``p``.

    >>> round(_binomial_at_most(0, 90, 0.05), 4), round(_binomial_at_most(1, 40, 0.05), 4)
    (0.0099, 0.3991)
    """
    log_p, log_q = math.log(p), math.log1p(-p)
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(x + 1)
                                 - math.lgamma(n - x + 1) + x * log_p + (n - x) * log_q)
                        for x in range(min(k, n) + 1)))
