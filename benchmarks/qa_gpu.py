"""`python -m benchmarks.qa_gpu MODEL_DIR`: serve a 7–8B instruct model with vLLM on one GPU
and run `runwatch bench qa` against it through the OpenAI-compatible backend.

It lives beside the other benchmarks, outside ``bot.qa``: the question-answering package
starts no process (tests/bot/qa/test_security.py).

The served path is the production one (vLLM, TGI, llama.cpp's server, Ollama all speak it);
this script only starts vLLM, waits for it, runs the benchmark and stops the server by its
PID (SIGTERM, then SIGKILL after a grace period). The settings (one GPU, bf16, 8k context,
greedy decoding) are :data:`VLLM_ARGS`; BENCHMARKS.md's QA section says which model and GPU
they were measured on — until a GPU machine runs this, none.

Needs ``pip install vllm`` on the GPU machine (it brings its own CUDA torch; keep it out of
runwatch's CPU virtualenv). Example::

    python -m benchmarks.qa_gpu /models/Qwen2.5-7B-Instruct --json qa-gpu.json
    make bench-gpu MODEL=/models/Meta-Llama-3.1-8B-Instruct
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.processes import stop as stop_process

# One GPU (80–141 GB), a 7–8B model in bf16: weights ≈ 16 GB, the rest is KV cache. The
# questions are short (a fact sheet is < 2k tokens), so 8k context is ample; greedy decoding
# keeps the benchmark repeatable.
VLLM_ARGS = ["--dtype", "bfloat16", "--max-model-len", "8192", "--gpu-memory-utilization",
             "0.85", "--tensor-parallel-size", "1", "--max-num-seqs", "16"]
READY_TIMEOUT_S = 900.0  # loading 16 GB of weights from a cold disk takes minutes
STOP_GRACE_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_command(model_dir: Path, name: str, port: int, python: str = sys.executable,
                 extra: list[str] | None = None) -> list[str]:
    """The argv that serves ``model_dir`` as ``name`` on ``port`` (a list: no shell)."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
            *VLLM_ARGS, *(extra or [])]


def wait_ready(base_url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode} before it was ready; "
                             f"its log says why")
        try:
            with urllib.request.urlopen(f"{base_url}/models", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise SystemExit(f"vLLM was not ready after {timeout_s:.0f} s; raise --ready-timeout "
                     f"or check its log")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group by its PID, SIGKILL it if it does not stop."""
    stop_process(proc, STOP_GRACE_S, group=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.qa_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="a Hugging Face model folder")
    parser.add_argument("--name", help="served model name (default: the folder's name)")
    parser.add_argument("--limit", type=int, help="ask the model only N questions")
    parser.add_argument("--budget", type=float, default=9.0, help="model seconds per answer")
    parser.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S)
    parser.add_argument("--python", default=sys.executable,
                        help="the Python that has vllm installed")
    parser.add_argument("--json", default="qa-gpu.json", help="the full result, written here")
    parser.add_argument("--log", default="vllm.log", help="vLLM's output, written here")
    parser.add_argument("--no-deterministic", action="store_true",
                        help="score only the served model")
    args = parser.parse_args(argv)
    if not (args.model_dir / "config.json").exists():
        parser.error(f"{args.model_dir} is not a model folder (no config.json)")
    name = args.name or args.model_dir.name
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(args.log, "w") as log:
        proc = subprocess.Popen(vllm_command(args.model_dir, name, port, args.python),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            started = time.monotonic()
            wait_ready(base_url, proc, args.ready_timeout)
            print(f"vLLM serving {name} on {base_url} after "
                  f"{time.monotonic() - started:.0f} s")
            from benchmarks.qa import main as bench

            bench_args = ["--backend", "openai", "--base-url", base_url, "--model", name,
                          "--budget", str(args.budget), "--max-new-tokens", "160",
                          "--json", args.json]
            if args.limit:
                bench_args += ["--limit", str(args.limit)]
            if args.no_deterministic:
                bench_args.append("--no-deterministic")
            code = bench(bench_args)
        finally:
            stop(proc)
    result = json.loads(Path(args.json).read_text())
    print(json.dumps({k: v for k, v in result.items()
                      if not k.endswith(("failures", "answers"))}, indent=1))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
