"""Where the shared corpus of real training logs is: ``../shared/corpus`` beside the checkout
(or ``RUNWATCH_CORPUS``). Tests that use it are skipped when it is absent; it is never copied
into the project."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("RUNWATCH_CORPUS", ROOT.parent / "shared" / "corpus"))
