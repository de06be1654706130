"""The real corpus (tests/realcorpus/, issue 22) is consistent: every file is listed in the
manifest with a source, commit and licence, every listed file is present and unchanged, the
dev/test split is the one the path hash gives, and the labels name only listed files."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "realcorpus"
FAMILIES = {"loss", "eval", "grad_norm", "throughput", "plateau", "rl"}
GRADES = {"clear", "mild", "borderline"}


def _manifest() -> list[dict[str, str]]:
    with (ROOT / "MANIFEST.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _split_of():
    spec = importlib.util.spec_from_file_location("realcorpus_split", ROOT / "split.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.split_of


def test_every_file_listed_and_every_listed_file_present():
    rows = _manifest()
    listed = [r["path"] for r in rows]
    assert len(listed) == len(set(listed)), "a path is listed twice"
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "files").rglob("*") if p.is_file()}
    assert on_disk - set(listed) == set(), \
        f"files not in MANIFEST.csv: {sorted(on_disk - set(listed))}"
    assert set(listed) - on_disk == set(), f"listed but missing: {sorted(set(listed) - on_disk)}"


def test_manifest_rows_attributed_and_unchanged():
    for r in _manifest():
        assert r["source_repo"].count("/") == 1, r["path"]
        assert r["source_path"], r["path"]
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]), r["path"]
        assert r["license"].strip(), f"{r['path']}: empty licence"
        assert r["run_kind"] in {"pretrain", "sft", "rl", "other"}, r["path"]
        assert r["path"].startswith(f"files/{r['format']}/"), r["path"]
        data = (ROOT / r["path"]).read_bytes()
        assert len(data) == int(r["bytes"]), r["path"]
        assert hashlib.sha256(data).hexdigest() == r["sha256"], \
            f"{r['path']} changed since it was recorded"


def test_split_is_the_path_hash():
    split_of = _split_of()
    for r in _manifest():
        assert r["split"] in {"dev", "test"}
        assert split_of(r["path"]) == r["split"], \
            f"{r['path']}: split {r['split']} is not the hash's"


def test_labels_reference_listed_files_and_follow_the_protocol():
    listed = {r["path"] for r in _manifest()}
    labels = tomllib.loads((ROOT / "LABELS.toml").read_text(encoding="utf-8"))["file"]
    paths = [f["path"] for f in labels]
    assert len(paths) == len(set(paths)), "a file is labelled twice"
    assert set(paths) == listed, \
        f"unlabelled: {sorted(listed - set(paths))}; unknown: {sorted(set(paths) - listed)}"
    for f in labels:
        assert f["status"] in {"healthy", "event", "excluded"}, f["path"]
        events = f.get("event", [])
        counted = [e for e in events if e["grade"] in {"clear", "mild"}]
        if f["status"] == "event":
            assert counted, f"{f['path']}: status event without a clear or mild event"
        if f["status"] == "healthy":
            assert not counted, f"{f['path']}: healthy with a clear or mild event"
        if f["status"] == "excluded":
            assert f.get("reason"), f["path"]
        for e in events:
            assert e["family"] in FAMILIES, (f["path"], e)
            assert e["grade"] in GRADES, (f["path"], e)
            assert isinstance(e["onset"], int), (f["path"], e)
            assert e["metric"] and e["kind"] and e["note"], (f["path"], e)


def test_labels_frozen_hash_recorded():
    digest = hashlib.sha256((ROOT / "LABELS.toml").read_bytes()).hexdigest()
    protocol = (ROOT / "PROTOCOL.md").read_text(encoding="utf-8")
    assert f"sha256 of LABELS.toml: {digest}" in protocol, \
        "LABELS.toml changed without updating the freeze line in PROTOCOL.md"
