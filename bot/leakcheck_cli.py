"""`runwatch leakcheck TRAIN EVAL`: arguments and the printed report of the leakage check
(the check itself is ``connectors.training.leakcheck``, usable where the training runs)."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from connectors.training.leakcheck import SUFFIXES, LeakInputError, check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Find eval rows that also appear in the training data: equal after normalisation "
        "(case, punctuation, spacing) or nearly (character 5-gram Jaccard, MinHash/LSH). "
        f"Reads {', '.join(SUFFIXES)} files or a folder saved by `datasets`. Exit status 0: "
        "no overlap; 1: overlap found; 2: input it cannot use.")
    parser.add_argument("train", help="training data: a file or a folder")
    parser.add_argument("eval", help="evaluation data: a file or a folder")
    parser.add_argument("--field", default="text", help="the text field or column "
                                                        "(default: text)")
    parser.add_argument("--threshold", type=float, default=0.7,
                        help="Jaccard similarity that counts as a near duplicate (default 0.7)")
    parser.add_argument("--examples", type=int, default=5, help="matches to show (default 5)")
    parser.add_argument("--json", action="store_true",
                        help="the report as one JSON object, with every matched eval row")


def _clip(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def run_leakcheck(args: argparse.Namespace, console: Console, err_console: Console) -> int:
    try:
        report = check(args.train, args.eval, args.field, threshold=args.threshold,
                       examples=args.examples)
    except LeakInputError as exc:
        err_console.print(f"[red]runwatch leakcheck:[/] {escape(str(exc))}")
        return 2
    for side, count in report.skipped.items():
        if count:
            err_console.print(f"{side}: {count:,} rows skipped (no text in {args.field!r} or "
                              f"not JSON)")
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict()) + "\n")
        return 1 if report.matched_rows else 0
    console.print(escape(report.summary()) + f" in {report.seconds:.1f} s")
    if report.examples:
        table = Table("eval row", "train row", "match", "eval text", "train text",
                      title="examples")
        for m in report.examples:
            table.add_row(str(m.eval_row), str(m.train_row),
                          "exact" if m.kind == "exact" else f"near {m.similarity:.2f}",
                          escape(_clip(m.eval_text)), escape(_clip(m.train_text)))
        console.print(table)
        console.print("Remove these rows from the eval set (or from train) before trusting "
                      "its numbers: the model has seen them.")
    return 1 if report.matched_rows else 0
