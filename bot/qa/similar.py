"""Similar past incidents: embedding search over the alerts of other runs (and earlier
attempts), with what resolved them."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from bot.qa.embeddings import Embedder, UsesEmbedder
from bot.qa.facts import FactSheet, Source
from bot.qa.retrieve import (
    Context,
    actions,
    findings,
    level_moves,
    moves_elsewhere,
    nonfinite_elsewhere,
    nonfinite_facts,
    quote,
    unalerted_moves,
)

MIN_SCORE = 0.6  # for an alert of another signal; the same signal always counts
TOP_K = 3


THREAD_LINES = 2  # what people said in a similar alert's thread, shown per incident


def incident_text(finding: dict[str, Any], said: list[str] = ()) -> str:
    """What an alert is about, in words an embedding can compare (no run name: the same
    trouble on another run must look alike), with what people said in its thread."""
    payload = finding.get("payload") or {}
    talk = " ".join(text.replace(finding["run"], "the run") for text in said)
    return (f"{finding['signal']} on {finding['metric']}: "
            f"{finding['summary'].replace(finding['run'], 'the run')} "
            f"({payload.get('kind', '')}) {talk}").strip()


class SimilarIncidents(UsesEmbedder):
    """Embeds each alert once (cached by fingerprint and summary) and ranks them."""

    def __init__(self, embedder: Embedder | None = None) -> None:
        super().__init__(embedder)
        self._cache: dict[tuple[str, str], np.ndarray] = {}
        self._lock = threading.Lock()

    def _vectors(self, texts: list[str], keys: list[tuple[str, str]],
                 query: str) -> tuple[np.ndarray, np.ndarray]:
        if not getattr(self.embedder, "per_call", False):  # vectors can be cached
            with self._lock:
                missing = [(k, t) for k, t in zip(keys, texts, strict=True)
                           if k not in self._cache]
                if missing:
                    vecs = self.embedder.embed([t for _, t in missing])
                    self._cache.update({k: v for (k, _), v in zip(missing, vecs, strict=True)})
                rows = np.stack([self._cache[k] for k in keys]) if keys else np.zeros((0, 1))
            return self.embedder.embed([query])[0], rows
        vecs = self.embedder.embed([query, *texts])
        return vecs[0], vecs[1:]

    def __call__(self, ctx: Context, sheet: FactSheet) -> None:
        run = ctx.run
        own = findings(ctx.store, run)
        if ctx.entities.nonfinite:  # "has any other run NaN'd?": values, alerted or not
            nonfinite_facts(ctx, sheet, run)
            nonfinite_elsewhere(ctx, sheet, run)
            return  # alerts of another kind are not what was asked
        context = [f for f in own if f["fingerprint"] == ctx.alert] if ctx.alert else []
        context = context or [f for f in own if f["state"] == "firing"][-2:] or own[-1:]
        named = ctx.entities.signals  # "have we seen overfitting like this before?"
        context = [f for f in context if f["signal"] in named] or context
        if not context:  # no alert: what moved with none, and whether it moved elsewhere
            moved = level_moves(ctx.store, run, only=ctx.entities.metrics or None,
                                covered_too=True)
            if not moved or not (ctx.entities.metrics or ctx.entities.moved):
                # a fact, not a gap: the record is complete, there is just nothing to compare
                sheet.add("similar", f"runwatch has raised no alert on {run}, so it has no "
                                     f"incident to compare with earlier ones.", source=Source(run))
                return
            unalerted_moves(ctx, sheet, run, only=[moved[0][0]], covered_too=True)
            moves_elsewhere(ctx, sheet, run, moved[0][0])
            return
        current_attempt = max(f["attempt"] for f in own)
        candidates = []
        for other in ctx.store.run_names():
            if not ctx.visible(other):
                continue
            for f in findings(ctx.store, other):
                if other == run and f["attempt"] >= current_attempt:
                    continue  # the run's own present is not its past
                candidates.append(f)
        if not candidates:
            sheet.add("similar", "No earlier alert on any visible run to compare with.",
                      source=Source(run))
            return
        query = " ".join(incident_text(f) for f in context)
        said = {f["fingerprint"]: [m["text"] for m in ctx.store.thread_messages(f["fingerprint"])]
                for f in candidates}
        texts = [incident_text(f, said[f["fingerprint"]]) for f in candidates]
        keys = [(f["fingerprint"], f"{f['summary']}|{len(said[f['fingerprint']])}")
                for f in candidates]
        q, rows = self._vectors(texts, keys, query)
        scores = rows @ q
        signals = {f["signal"] for f in context}
        ranked = sorted(zip(scores.tolist(), candidates, strict=True),
                        key=lambda p: (p[1]["signal"] in signals, p[0]), reverse=True)
        hits = [(s, f) for s, f in ranked if s >= MIN_SCORE or f["signal"] in signals][:TOP_K]
        sheet.add("similar", f"Compared with {len(candidates)} earlier alert(s) on visible runs "
                             f"({self.embedder.name}).", len(candidates), source=Source(run))
        if not hits:
            for f in context:
                sheet.alert(run, f["signal"], f["state"], f["onset_step"], f["resolved_step"])
            named = " or ".join(f"{f['signal']} on {run} from step {f['onset_step']}"
                                for f in context)
            sheet.add("similar", f"None of the {len(candidates)} earlier alert(s) on visible "
                                 f"runs is like {named}.", len(candidates),
                      *[f["onset_step"] for f in context], source=Source(run))
            return
        for _, f in hits:
            self._describe(ctx, sheet, f)

    @staticmethod
    def _describe(ctx: Context, sheet: FactSheet, f: dict[str, Any]) -> None:
        src = Source(f["run"], f["onset_step"], alert=f["fingerprint"], attempt=f["attempt"])
        outcome = (f"resolved at step {f['resolved_step']}" if f["state"] == "resolved"
                   and f["resolved_step"] is not None else f"still {f['state']}")
        sheet.add("similar", f"Similar past incident: {f['signal']} on {f['run']} from step "
                             f"{f['onset_step']}, {outcome}: {f['summary'].rstrip('.')}.",
                  f["onset_step"], f["resolved_step"] if f["resolved_step"] is not None
                  else float("nan"), source=src)
        sheet.alert(f["run"], f["signal"], f["state"], f["onset_step"], f["resolved_step"])
        for message in ctx.store.thread_messages(f["fingerprint"])[-THREAD_LINES:]:
            sheet.add("similar", f"In that alert's thread, someone wrote: "
                                 f"{quote(message['text'])}.", source=src)
        later = [a for a in actions(ctx.store, f["run"]) if a["at"] >= f["first_seen"]]
        for a in later[:2]:
            detail = f" ({quote(a['detail'])})" if a.get("detail") else ""
            sheet.add("similar", f"After that alert, {a['action']} on {f['run']} was "
                                 f"{a['status']}{detail}.", source=src)
        if f["state"] == "resolved" and not later:
            sheet.add("similar", f"No rollback or stop was recorded for {f['run']} after that "
                                 f"alert; it resolved on its own.", source=src)
