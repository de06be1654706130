"""Role confusion: the model writes the user's turn, or role markers, in its own answers."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

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
    example_evidence,
    judged_episodes,
    judged_evaluations,
    share,
    shown_evaluations,
)

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
    the share of confused outputs; an evaluation is bad when the rate exceeds
    ``threshold``, and after ``patience`` bad evaluations in a row the finding fires, its
    onset at the first. It resolves once the rate is back to half the threshold. The
    rollback target is the latest checkpoint at or before the last evaluation below the
    threshold, when there is one (a template error present from the first evaluation is
    not undone by rolling back).

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
        Share of confused outputs above which an evaluation is bad (0.05 = 5%). Lower
        reports a rare slip; higher waits until it is common.
    patience : int, default 2
        Bad evaluations in a row before firing. More rides out one unlucky sample; fewer
        alerts an evaluation sooner.
    min_outputs : int, default 5
        Outputs an evaluation needs to be judged; one with fewer is skipped (one
        confused output of three is not a rate).

    *False-positive guard*: markers inside fenced code blocks are not counted (an answer
    that explains a chat template quotes them), and transcript markers count only at
    the start of a line, not in prose that mentions a user; ``min_outputs`` and
    ``patience`` ask for a sustained, well-sampled rate. There is no warm-up exclusion:
    any confusion in logged generations is worth reading. The resolve level (half the
    threshold) is below the firing one, so a rate at the edge does not flap.

    Examples
    --------
    >>> from analyzers import RunData
    >>> rows = [{"step": s, "prompt": f"question {i}", "output": f"Here is answer {i}."}
    ...         for s in (100, 200, 300, 400) for i in range(10)]
    >>> for s in (300, 400):
    ...     rows += [{"step": s, "prompt": "question", "output": "Sure.\\nUser: thanks!"}] * 3
    >>> [finding] = RoleConfusion().detect(RunData.from_series("demo", {}, generations=rows))
    >>> finding.onset_step, finding.detected_step, finding.state, finding.rollback_to
    (300, 400, 'firing', None)
    >>> print(finding.summary)  # doctest: +NORMALIZE_WHITESPACE
    3 of 13 sample generations (23%) at step 400 write the user's turn or a role marker
    (threshold 5%), for 2 evaluations in a row; most often 'User:'
    """

    signal = "role_confusion"

    def __init__(self, metric: str = "generations/role_confusion",
                 patterns: tuple[str, ...] = DEFAULT_PATTERNS, threshold: float = 0.05,
                 patience: int = 2, min_outputs: int = 5) -> None:
        check_metric(metric)
        self._compiled = _compile(patterns)
        check_real("threshold", threshold, 0.0, allow_equal=True, below=1.0)
        check_int("patience", patience, 1)
        check_int("min_outputs", min_outputs, 1)
        self.metric = metric
        self.patterns = patterns
        self.threshold = threshold
        self.patience = patience
        self.min_outputs = min_outputs

    def detect(self, data: RunData) -> list[Finding]:
        judged = judged_evaluations(data.generations, self._evaluate)
        return [self._finding(data, judged, episode)
                for episode in judged_episodes(judged, floor=self.threshold, margin=None,
                                               patience=self.patience)]

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
        summary = (f"{fired.confused} of {fired.outputs} sample generations "
                   f"({share(fired.rate)}) at step {fired.step} write the user's turn or a "
                   f"role marker (threshold {100 * self.threshold:g}%), for "
                   f"{episode.fired - episode.onset + 1} evaluations in a row")
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
