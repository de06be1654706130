"""``[qa]`` in runwatch.toml: which model phrases answers.

Its own module, free of LangChain and torch, so that reading the configuration (every
command, `runwatch --help` included) does not import the model stack.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SMOLLM2 = "smollm2"


class ModelConfig(BaseModel):
    """``[qa]`` in runwatch.toml: which model phrases answers."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["transformers", "openai", "none"] = Field(
        "transformers", description="transformers: in-process; openai: an OpenAI-compatible "
                                    "server; none: deterministic answers only")
    model: str = Field(SMOLLM2, description="transformers: a model folder, a .gguf file or "
                                            "'smollm2'; openai: the served model's name")
    device: str = Field("auto", description="auto (CUDA when present), cpu, cuda, cuda:1, …")
    max_new_tokens: int = Field(96, ge=1, description="Longest answer, in tokens")
    timeout_s: float = Field(8.0, gt=0, description="Longest generation, in seconds")
    base_url: str | None = Field(None, description="openai: e.g. http://gpu-box:8000/v1")
    api_key_env: str = Field("RUNWATCH_LLM_API_KEY",
                             description="openai: environment variable holding the API key")
    cache_dir: str | None = Field(None, description="Where converted GGUF models are kept "
                                                    "(default ~/.cache/runwatch/models)")
