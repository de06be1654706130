"""What a training run was made of, captured once at its start (seed §4.3–4.4): the data, the
base model, the code and the environment — so "what was changed then?" has an answer.

Owns :func:`capture` (called by :class:`connectors.training.torchloop.RunLogger` and so by the
HF and Lightning callbacks, nothing per step), the flattening and diff of configurations that the
training side and the bot share (:func:`flatten`, :func:`diff`), and the history of attempts
kept beside the run (``<run_dir>/.runwatch-versions.json``) from which a resume with another
configuration becomes a *change event* at its step.

Cost: a directory listing for the installed packages, two ``git`` calls, and file hashes
bounded by :data:`HASH_BYTES` per file (head and tail of larger files, said so in the
record): well under a second on a cold start.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import xxhash

HISTORY_FILE = ".runwatch-versions.json"
LAUNCH_ENV = "RUNWATCH_LAUNCH_START"  # names a start of `runwatch launch` to its command
EXTRA = ("leakcheck",)  # kept with an attempt in the history, never compared
HASH_BYTES = 16 << 20  # a file larger than this is hashed by its first and last 8 MiB + size
KEY_PACKAGES = ("torch", "transformers", "accelerate", "datasets", "lightning", "peft", "trl",
                "deepspeed", "flash_attn", "numpy", "tokenizers", "safetensors")
IMAGE_ENV = ("RUNWATCH_IMAGE_DIGEST", "IMAGE_DIGEST", "CONTAINER_IMAGE_DIGEST",
             "CONTAINER_IMAGE")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
MISSING = "missing"
_DIST_INFO = re.compile(r"^(?P<name>.+?)-(?P<version>[^-]+?)\.(dist|egg)-info$")


# --------------------------------------------------------------------------- hashing


def file_record(path: str | os.PathLike[str], root: Path | None = None) -> dict[str, Any]:
    """Size and content hash of one file; large files by head, tail and size (``"sampled"``)."""
    path = Path(path)
    size = path.stat().st_size
    digest = xxhash.xxh3_64()
    with open(path, "rb") as handle:
        if size <= HASH_BYTES:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        else:
            digest.update(handle.read(HASH_BYTES // 2))
            handle.seek(size - HASH_BYTES // 2)
            digest.update(handle.read())
            digest.update(str(size).encode())
    name = str(path.relative_to(root)) if root and path.is_relative_to(root) else str(path)
    record = {"path": name, "size": size, "xxh3": digest.hexdigest()}
    if size > HASH_BYTES:
        record["sampled"] = True
    return record


def _files(path: Path, suffixes: tuple[str, ...] | None = None,
           limit: int = 64) -> list[dict[str, Any]]:
    if path.is_file():
        return [file_record(path)]
    found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")
                   and (suffixes is None or p.name.endswith(suffixes)))
    return [file_record(p, path) for p in found[:limit]]


# --------------------------------------------------------------------------- parts


def data_record(data: Any) -> dict[str, Any]:
    """A dataset as far as it can be told: a path (files hashed), a ``datasets`` object (name,
    config, version, fingerprint, cache files), or a torch ``DataLoader`` around one of them.
    Anything else is recorded by its type and length."""
    if data is None:
        return {}
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.exists():
            return {"path": str(path), "error": "no such file or folder"}
        return {"path": str(path), "files": _files(path)}
    if hasattr(data, "dataset") and not hasattr(data, "_fingerprint"):  # a DataLoader
        data = data.dataset
    record: dict[str, Any] = {"type": type(data).__name__}
    info = getattr(data, "info", None)
    for key, value in (("name", getattr(info, "dataset_name", None)),
                       ("config", getattr(info, "config_name", None)),
                       ("version", getattr(info, "version", None)),
                       ("fingerprint", getattr(data, "_fingerprint", None)),
                       ("split", getattr(data, "split", None))):
        if value is not None:
            record[key] = str(value)
    cache_files = getattr(data, "cache_files", None) or []
    if cache_files:
        record["files"] = [file_record(f["filename"]) for f in cache_files[:16]
                           if isinstance(f, Mapping) and Path(f.get("filename", "")).exists()]
    try:
        record["rows"] = len(data)
    except TypeError:
        pass
    return record


def model_record(model: Any) -> dict[str, Any]:
    """A base model: a path (weight files hashed), or a model object — its class, its
    ``config._name_or_path`` and hub revision (``_commit_hash``), and the weight files'
    hashes when that name is a local folder."""
    if model is None:
        return {}
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        record: dict[str, Any] = {"name": str(model)}
    else:
        config = getattr(model, "config", None)
        name = getattr(config, "_name_or_path", None) or None
        record = {"class": type(model).__name__}
        if name:
            record["name"] = name
        revision = getattr(config, "_commit_hash", None)
        if revision:
            record["revision"] = revision
        path = Path(name) if name else None
    if path is not None and path.is_dir():
        record["weights"] = _files(path, WEIGHT_SUFFIXES, limit=16)
    return record


def code_record(directory: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The git commit of ``directory`` (the working directory by default) and whether the
    tracked files differ from it. Two ``git`` calls with fixed argv."""
    directory = str(directory or os.getcwd())
    try:
        head = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], timeout=5,
                              capture_output=True, text=True, check=False)
        if head.returncode != 0:
            return {"dir": directory, "commit": MISSING, "why": "not a git repository"}
        status = subprocess.run(["git", "-C", directory, "status", "--porcelain",
                                 "--untracked-files=no"], timeout=5, capture_output=True,
                                text=True, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"dir": directory, "commit": MISSING, "why": f"git: {exc}"}
    return {"dir": directory, "commit": head.stdout.strip(),
            "dirty": bool(status.stdout.strip())}


def installed_packages() -> dict[str, str]:
    """Every installed distribution, name → version, from the ``*.dist-info`` folder names on
    ``sys.path`` (a listing; reading each package's metadata costs ~0.5 s)."""
    packages: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            match = _DIST_INFO.match(name)
            if match:
                key = match["name"].lower().replace("-", "_").replace(".", "_")
                packages.setdefault(key, match["version"])
    return packages


def _driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(\S+)", text)
    return match.group(1) if match else text.split("\n")[0].strip()


def environment_record() -> dict[str, Any]:
    packages = installed_packages()
    record: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "packages": {name: packages[name] for name in KEY_PACKAGES if name in packages},
        "packages_hash": xxhash.xxh3_64_hexdigest(
            "\n".join(f"{k}=={v}" for k, v in sorted(packages.items())).encode()),
        "packages_count": len(packages),
    }
    torch = sys.modules.get("torch")  # imported by the training script; never imported here
    if torch is not None:
        record["torch"] = torch.__version__
        record["cuda"] = torch.version.cuda or "none"
    driver = _driver()
    if driver:
        record["driver"] = driver
    image = next((os.environ[name] for name in IMAGE_ENV if os.environ.get(name)), None)
    if image:
        record["image"] = image
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        record["container"] = True
    return record


def capture(*, data: Any = None, eval_data: Any = None, model: Any = None,
            code_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Everything above in one record (the training config travels beside it, as ``config``
    of the meta line). Parts that cannot be told are left out, never guessed."""
    started = time.perf_counter()
    record: dict[str, Any] = {"code": code_record(code_dir), "environment": environment_record()}
    data_part = {k: v for k, v in (("train", data_record(data)),
                                   ("eval", data_record(eval_data))) if v}
    if data_part:
        record["data"] = data_part
    model_part = model_record(model)
    if model_part:
        record["model"] = model_part
    record["captured_s"] = round(time.perf_counter() - started, 4)
    return record


# --------------------------------------------------------------------------- eval suites

SUITE_HASH_CHARS = 12  # a suite file's version: this many hex digits of its sha256


@functools.lru_cache(maxsize=64)
def _suite_file_hash(path: str, mtime_ns: int, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:SUITE_HASH_CHARS]


def suite_version(path: str | os.PathLike[str]) -> str:
    """The version of an eval suite held in a file (prompts or examples): the first
    :data:`SUITE_HASH_CHARS` hex digits of its content's sha256, so the same file gives the
    same version on the training side and in the bot. Read again only when the file's size
    or modification time changed. Raises ``OSError`` when it cannot be read.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
    ...     _ = f.write('{"prompt": "2+2?"}\\n')
    >>> suite_version(f.name)
    '8c643df3506b'
    """
    stat = os.stat(path)
    return _suite_file_hash(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


def suite_versions(suites: Mapping[str, Any] | None) -> dict[str, str]:
    """Name → version of the eval suites a run evaluates with: a value that is an existing
    file is hashed (:func:`suite_version`), any other value is the declared version.

    >>> suite_versions({"mmlu": "v3", "business": 7})
    {'mmlu': 'v3', 'business': '7'}
    """
    versions = {}
    for name, spec in (suites or {}).items():
        path = Path(spec) if isinstance(spec, (str, os.PathLike)) else None
        versions[str(name)] = suite_version(path) if path is not None and path.is_file() \
            else str(spec)
    return versions


# --------------------------------------------------------------------------- diff


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists of file records by path.

    >>> flatten({"lr": 3e-4, "data": {"train": {"files": [{"path": "a", "xxh3": "1"}]}}})
    {'lr': 0.0003, 'data.train.files[a].xxh3': '1'}
    """
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and value and all(
            isinstance(v, Mapping) and "path" in v for v in value):
        for item in value:
            rest = {k: v for k, v in item.items() if k != "path"}
            out.update(flatten(rest, f"{prefix}[{item['path']}]"))
    else:
        out[prefix] = value
    return out


# Keys that differ between any two runs without making them different experiments.
NOISE = re.compile(r"(^|\.)(captured_s|output_dir|logging_dir|run_name|dir|started_at|"
                   r"start_step|hub_token|push_to_hub_token|resume_from_checkpoint|"
                   r"resume_from)$")


def comparable(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """:func:`flatten` without the keys that differ between any two runs (:data:`NOISE`)."""
    return {k: v for k, v in flatten(record or {}).items() if not NOISE.search(k)}


def diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None,
         ignore: Iterable[str] = ()) -> dict[str, tuple[Any, Any]]:
    """Dotted key → (before, after) for every value that differs; a key on one side only
    shows :data:`MISSING` on the other.

    >>> diff({"lr": 3e-4, "epochs": 3}, {"lr": 6e-4, "epochs": 3, "seed": 1})
    {'lr': (0.0003, 0.0006), 'seed': ('missing', 1)}
    """
    a, b = flatten(before or {}), flatten(after or {})
    skip = set(ignore)
    changed = {}
    for key in sorted(a.keys() | b.keys()):
        if key in skip or NOISE.search(key):
            continue
        old, new = a.get(key, MISSING), b.get(key, MISSING)
        if old != new and not (_number(old) and _number(new) and float(old) == float(new)):
            changed[key] = (old, new)
    return changed


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --------------------------------------------------------------------------- history


def _attempts(path: Path) -> list[dict[str, Any]]:
    try:
        history = json.loads(path.read_text())
        attempts = history["attempts"] if isinstance(history, dict) else []
    except (OSError, ValueError, KeyError):
        attempts = []
    return [a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []


def record_attempt(run_dir: str | os.PathLike[str], config: Mapping[str, Any] | None,
                   versions: Mapping[str, Any], step: int | None, *,
                   source: str | None = None, launch: str | None = None,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Append this attempt to the run's history file; return the change event when an
    earlier attempt ran with another config, data, model, code or environment:
    ``{"step", "at", "attempt", "changes": {key: [before, after]}}``.

    ``source="launch"`` is ``runwatch launch`` recording a start from outside the command,
    ``launch`` naming that start (it passes the name to the command in :data:`LAUNCH_ENV`).
    A helper inside the command (``RunLogger``) that passes the same ``launch`` replaces that
    record with its own, which sees more (the script's config, torch, CUDA), keeping the
    parts only the launcher was told (data, model), its ``extra`` and its step when it gives
    none: one attempt per start, whoever records it. ``extra`` (:data:`EXTRA`: the leakage
    check at start) is kept with the attempt and never compared."""
    path = Path(run_dir) / HISTORY_FILE
    attempts = _attempts(path)
    entry: dict[str, Any] = {"at": time.time(), "step": step, "config": dict(config or {}),
                             "versions": dict(versions)}
    if source is not None:
        entry["source"] = source
    if launch is not None:
        entry["launch"] = launch
    entry.update({k: v for k, v in (extra or {}).items() if k in EXTRA})
    if (source != "launch" and launch is not None and attempts
            and attempts[-1].get("source") == "launch" and attempts[-1].get("launch") == launch):
        outside = attempts.pop()
        entry["versions"] = {**(outside.get("versions") or {}), **entry["versions"]}
        entry["outside"] = {"config": outside.get("config"), "versions": outside.get("versions")}
        entry.update({k: outside[k] for k in EXTRA if k in outside and k not in entry})
        if step is None:
            entry["step"] = step = outside.get("step")
    event = None
    last = attempts[-1] if attempts else None
    if source == "launch" and last is not None and last.get("source") != "launch":
        last = last.get("outside")  # the launcher compares what it saw, not what a script saw
    if last:
        changes = diff({"config": last.get("config"), **(last.get("versions") or {})},
                       {"config": entry["config"], **entry["versions"]})
        if changes:
            event = {"step": step, "at": entry["at"], "attempt": len(attempts) + 1,
                     "changes": {k: list(v) for k, v in changes.items()}}
    if event:
        entry["event"] = event
    attempts.append(entry)
    _save(path, attempts)
    return event


def _save(path: Path, attempts: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"attempts": attempts}, default=str))
    os.replace(tmp, path)


def change_events(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every change event recorded for the run, oldest first."""
    return [a["event"] for a in _attempts(Path(run_dir) / HISTORY_FILE) if a.get("event")]


def recorded(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What the run's history file tells a reader whose log does not say it (a command run
    by ``runwatch launch`` without runwatch's helpers): the latest attempt's ``versions``,
    every change event (``changes``), and the ``config`` of an attempt only the launcher
    recorded, and what it found at start (:data:`EXTRA`). Empty when there is no history."""
    attempts = _attempts(Path(run_dir) / HISTORY_FILE)
    if not attempts:
        return {}
    last = attempts[-1]
    out: dict[str, Any] = {"versions": last.get("versions") or {},
                           "changes": [a["event"] for a in attempts if a.get("event")]}
    if last.get("source") == "launch" and last.get("config"):
        out["config"] = last["config"]
    out.update({k: last[k] for k in EXTRA if k in last})
    return out
