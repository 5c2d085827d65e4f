"""A fake vLLM OpenAI server for launcher tests: accepts vLLM's command line, answers
/v1/models and /health, and records its argv and environment.

Started as `fake_vllm_node.py -m vllm.entrypoints.openai.api_server --port N ...` through a
wrapper that stands in for the Python interpreter. FAKE_NODE_FAIL_ROLE=kv_consumer makes the
node whose --kv-transfer-config has that kv_role exit after a second; FAKE_NODE_HANG=1 makes
every node start without ever listening. POST /v1/completions (the launcher's warm-ups) answers
200 and is recorded in PORT.posts, or answers FAKE_NODE_POST_STATUS when that is set; a P leg
(kv_transfer_params.do_remote_decode) gets kv_transfer_params back; FAKE_NODE_FAIL_FIRST_PULL=1
makes a D answer its first D leg with 500.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", dest="module")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--kv-transfer-config", default=None)
    args, _ = parser.parse_known_args()
    record_dir = os.environ.get("FAKE_NODE_RECORD_DIR")
    if record_dir:
        env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_", "CUDA_"))}
        Path(record_dir, f"{args.port}.json").write_text(
            json.dumps({"argv": sys.argv[1:], "env": env, "pid": os.getpid()})
        )
    transfer = json.loads(args.kv_transfer_config) if args.kv_transfer_config else {}
    if transfer.get("kv_role") and transfer.get("kv_role") == os.environ.get("FAKE_NODE_FAIL_ROLE"):
        time.sleep(1.0)  # lets the other nodes come up first, as a real failure would
        print("loading model...\nRuntimeError: boom, the fake node failed", file=sys.stderr)
        return 3
    if os.environ.get("FAKE_NODE_HANG"):
        time.sleep(600)
        return 0
    body = json.dumps({"object": "list", "data": [{"id": args.served_model_name}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's spelling)
            if self.path in ("/v1/models", "/health"):
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            request = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path != "/v1/completions":
                self.send_error(404)
                return
            if record_dir:
                with open(Path(record_dir, f"{args.port}.posts"), "a") as posts:
                    posts.write(request.decode() + "\n")
            status = int(os.environ.get("FAKE_NODE_POST_STATUS", "200"))
            reply: dict[str, object] = {"choices": [{"text": "x"}]}
            asked = (json.loads(request or b"{}").get("kv_transfer_params") or {})
            if asked.get("do_remote_prefill") and os.environ.get("FAKE_NODE_FAIL_FIRST_PULL"):
                failed_once = Path(record_dir or "/tmp", f"{args.port}.pull-failed")
                if not failed_once.exists():  # vLLM's 500 when the NIXL handshake times out
                    failed_once.touch()
                    status = 500
            if asked.get("do_remote_decode"):  # a P leg: say where the KV is, as NIXL does
                reply["kv_transfer_params"] = {"do_remote_prefill": True,
                                               "remote_engine_id": f"fake-{args.port}"}
            answer = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
