"""The API server under load: requests/s and tokens/s of `python -m jobs.serve` at 1, 8 and 32
concurrent clients (the official `openai` client, chat completions, greedy, the job's adapter), against
transformers' `generate` on the same base + adapter answering the same prompts one request at a time.

`python bench/serve_bench.py JOB_DIR [--clients 1 8 32] [--rounds 2] [--max-tokens 64]`; `--turns N` instead
holds one conversation of N turns (the history growing, as a chat does) and records each turn's seconds
and the server's batches and reuses (a kept GPU batch reused for the next turn: scheduler.py), with the
standard library alone (no `openai` client needed on the device); `--smoke` (with
a tiny job) runs one round at 1 and 2 clients and writes nothing. One JSON line per measurement is appended to
bench/results/serve.jsonl. Tokens are the completion tokens the server's `usage` counts (EOS included),
and the same count for generate; a row ending at EOS early makes fewer tokens in both."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "serve.jsonl"
QUESTIONS = ["What is the capital of France?", "Who are you?", "Name a colour.", "What is two plus two?",
             "Write one sentence about the sea.", "What do cats eat?", "Count from one to five.",
             "Why is the sky blue?"]


def start_server(job: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "jobs.serve", str(job), "--port", "0", "--max-waiting", "256",
                             *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        found = re.search(r"at (http://\S+/v1)", line)
        if found:
            threading.Thread(target=proc.stdout.read, daemon=True).start()   # drain
            return proc, found.group(1)
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def server_run(url: str, model: str, clients: int, rounds: int, max_tokens: int) -> dict:
    from openai import OpenAI
    client = OpenAI(base_url=url, api_key="none", max_retries=0, timeout=3600)

    def one_client(index: int) -> int:
        tokens = 0
        for r in range(rounds):
            question = QUESTIONS[(index + r) % len(QUESTIONS)]
            out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                                 max_tokens=max_tokens, temperature=0)
            tokens += out.usage.completion_tokens
        return tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one_client, range(clients)))
    seconds = time.perf_counter() - start
    return {"engine": "serve", "clients": clients, "requests": clients * rounds, "seconds": round(seconds, 3),
            "requests_per_s": round(clients * rounds / seconds, 3), "tokens_per_s": round(tokens / seconds, 2)}


def _post(url: str, body: dict | None = None) -> dict:
    import urllib.request
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.loads(answer.read())


def turns_run(url: str, model: str, turns: int, max_tokens: int) -> dict:
    """One client's conversation of `turns` turns, one request after another: seconds per turn."""
    health = url.removesuffix("/v1") + "/health"
    before, messages, seconds, tokens = _post(health), [], [], 0
    for turn in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        start = time.perf_counter()
        out = _post(url + "/chat/completions", {"model": model, "messages": messages, "max_tokens": max_tokens,
                                                "temperature": 0})
        seconds.append(round(time.perf_counter() - start, 3))
        tokens += out["usage"]["completion_tokens"]
        messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
    after = _post(health)
    return {"engine": "serve_turns", "clients": 1, "requests": turns, "turn_seconds": seconds,
            "seconds": round(sum(seconds), 3), "tokens_per_s": round(tokens / sum(seconds), 2),
            **{k: after.get(k, 0) - before.get(k, 0) for k in ("batches", "reuses", "joins")}}


def generate_run(job: Path, requests: int, max_tokens: int) -> dict:
    """transformers' generate, one request at a time, on the base + the job's adapter."""
    import torch

    from jobs.export.source import locate_base
    from jobs.export.job_config import exported_spec
    from jobs.models.load import load_for_chat
    model, tok = load_for_chat(str(locate_base(exported_spec(job), None, None, print)), str(job / "adapter"))
    eos = tok.eos_token_id
    tokens, start = 0, time.perf_counter()
    with torch.inference_mode():
        for i in range(requests):
            messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True).to(model.device)
            out = model.generate(**ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
            new = out[0, ids["input_ids"].shape[1]:].tolist()
            tokens += new.index(eos) + 1 if eos in new else len(new)
    seconds = time.perf_counter() - start
    return {"engine": "hf_generate", "clients": 1, "requests": requests, "seconds": round(seconds, 3),
            "requests_per_s": round(requests / seconds, 3), "tokens_per_s": round(tokens / seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job", type=Path, help="a finished job folder")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends, one after another")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--generate-requests", type=int, default=16,
                        help="requests for transformers' generate, one at a time (default 16)")
    parser.add_argument("--turns", type=int, default=0, help="one conversation of this many turns instead")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep-batches-s", type=float, default=None,
                        help="passed to the server (0: no kept batches, the A/B of their reuse)")
    parser.add_argument("--smoke", action="store_true", help="1 round at 1 and 2 clients, 8 tokens")
    args = parser.parse_args()
    if args.smoke:
        args.clients, args.rounds, args.max_tokens = [1, 2], 1, 8
    import torch
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    def record(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if not args.smoke:
            _append(row, device, args)
    extra = [] if args.keep_batches_s is None else ["--keep-batches-s", f"{args.keep_batches_s:g}"]
    proc, url = start_server(args.job, *extra)
    try:
        if args.turns:
            record({**turns_run(url, args.job.name, args.turns, args.max_tokens),
                    "keep_batches_s": args.keep_batches_s})
            return
        for clients in args.clients:
            record(server_run(url, args.job.name, clients, args.rounds, args.max_tokens))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    record(generate_run(args.job, 2 if args.smoke else args.generate_requests, args.max_tokens))


def _append(row: dict, device: str, args) -> None:
    """Append the row to the results at once, so an interrupted run keeps what it measured."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"device": device, "job": args.job.name, "max_tokens": args.max_tokens, **row}) + "\n")


if __name__ == "__main__":
    main()
