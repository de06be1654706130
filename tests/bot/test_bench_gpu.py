"""The GPU script end to end with a stand-in for vLLM: a real server process, started and
stopped by PID, speaking the OpenAI API, scored by the real benchmark."""

import json
import textwrap

import pytest

from benchmarks.qa_gpu import VLLM_ARGS, main, vllm_command

FAKE_VLLM = textwrap.dedent('''
    """Stands in for vllm.entrypoints.openai.api_server: the same flags, canned replies."""
    import argparse, json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--model"); parser.add_argument("--served-model-name")
    parser.add_argument("--host"); parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"data": [{"id": args.served_model_name}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not body.get("stream"):
                self._send({"choices": [{"message": {"role": "assistant",
                                                     "content": "FAC"}}]})
                return
            self.send_response(200)  # server-sent events, as vLLM streams
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in ({"choices": [{"delta": {"content": "FAC"}}]},
                          {"choices": [{"delta": {}, "finish_reason": "stop"}]}):
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
            self.wfile.write(b"data: [DONE]\\n\\n")
            self.wfile.flush()

        def log_message(self, *a):
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
''')


def test_the_vllm_command_is_an_argv_with_the_tested_shape(tmp_path):
    argv = vllm_command(tmp_path, "m", 8000, python="py")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--served-model-name") + 1] == "m" and VLLM_ARGS[0] in argv


def test_a_folder_that_is_no_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "no config.json" in capsys.readouterr().err


def test_serves_benchmarks_and_stops_the_server(tmp_path, monkeypatch):
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_VLLM)
    model = tmp_path / "Tiny-Instruct"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    out = tmp_path / "qa-gpu.json"
    assert main([str(model), "--limit", "3", "--no-deterministic", "--json", str(out),
                 "--log", str(tmp_path / "vllm.log"), "--ready-timeout", "60"]) == 0
    result = json.loads(out.read_text())
    # "FAC" is a fragment: the claim check rejects it and the facts' answer is posted
    assert result["Tiny-Instruct: questions"] == 3
    assert result["Tiny-Instruct: posted answers with a fragment"] == 0
    assert result["Tiny-Instruct: rejected sentences: fragment"] >= 2
