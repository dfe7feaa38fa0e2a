"""The server's decode alone, on one GPU: tokens/s of its CPU continuous batch (jobs/serve/batch.py, a
DynamicCache rows join and leave, eager steps), of GRPO's static-cache loop (jobs/train/decode.py, one
decode step replayed as a CUDA graph, the server's loop before continuous batching) and of the GPU's
joinable slot batch (jobs/serve/slots.py: that loop on a 32-row cache with room to join), at 1, 8 and
32 rows, greedy, random-init weights of a real model's shape with a LoRA adapter on (speed does not
depend on the weights' values). Also the share of greedy tokens the two agree on (bf16 rounding).

`python bench/serve_decode.py [--shapes smollm2-135m llama-3.2-1b] [--rows 1 8 32] [--new 128]
[--out FILE]`: one JSON line per measurement on stdout (and appended to FILE)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256),
}


def build(shape: str, device):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    lora = LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False)
    return get_peft_model(model, lora, adapter_name="job0").eval()


def prompts(rows: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(rows)
    return [torch.randint(5, vocab, (40 + (i * 7) % 25,), generator=generator).tolist() for i in range(rows)]


@torch.inference_mode()
def static_loop(model, batch, new: int) -> list[list[int]]:
    from jobs.train import decode
    from jobs.train.rollout import pad_left
    from kernels.packed_attention import cached_decoding_attention
    ids, mask = pad_left(batch, 0, model.device)
    with cached_decoding_attention(model):
        decoder, step = decode.start_decoder(model, ids, mask, new, 0.0, 1.0, set(), 0)
        columns = [decoder.out[:, 0].tolist()]
        for i in range(1, new):
            step()
            columns.append(decoder.out[:, i].tolist())   # the server read each column as it landed
    return [list(row) for row in zip(*columns)]


def slots(model, batch, new: int) -> list[list[int]]:
    """The server's GPU batch (jobs/serve/slots.py): a 32-row static cache with join room, a CUDA graph."""
    from jobs.serve.engine import SLOTS, adapter_on
    from jobs.serve.rows import Row, Sampling
    from jobs.serve.slots import SLOT_ROOM, SlotBatch
    rows = [Row(index=i, prompt=p, max_tokens=new, stop=[]) for i, p in enumerate(batch)]
    running = SlotBatch(model, Sampling(temperature=0.0), set(), 0, lambda ids: "", partial(adapter_on, model, "job0"),
                        max(SLOTS, len(rows)), SLOT_ROOM)
    running.admit(rows)
    running.retire()
    while running.rows:
        running.step()
        running.retire()
    return [row.tokens for row in rows]


def continuous(model, batch, new: int) -> list[list[int]]:
    from jobs.serve.batch import ContinuousBatch
    from jobs.serve.engine import adapter_on
    from jobs.serve.rows import Row, Sampling
    rows = [Row(index=i, prompt=p, max_tokens=new, stop=[]) for i, p in enumerate(batch)]
    running = ContinuousBatch(model, Sampling(temperature=0.0), set(), 0, lambda ids: "",
                              partial(adapter_on, model, "job0"))
    running.admit(rows)
    while running.rows:
        running.step()
        running.retire()
    return [row.tokens for row in rows]


def join_check(device) -> dict:
    """The tiny Llama (tests/tiny.py) in float32 on `device`, through the scheduler on the slot batch:
    a greedy request that joins mid-batch, and the one it joined, against transformers' generate."""
    import threading

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.serve.engine import Engine
    from jobs.serve.rows import Row, Sampling
    from jobs.serve.scheduler import Generation, Scheduler
    from tests.tiny import make_tiny_model
    folder = make_tiny_model("/tmp/serve_decode_tiny")
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder).to(device), lora, adapter_name="job0").eval()
    ask = lambda q: tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,   # noqa: E731
                                            return_dict=True)["input_ids"]

    def generate(prompt, n):
        out = model.generate(input_ids=torch.tensor([prompt], device=device), max_new_tokens=n, do_sample=False,
                             pad_token_id=tok.pad_token_id)
        return tok.decode(out[0, len(prompt):], skip_special_tokens=True)

    scheduler = Scheduler(Engine(model, batching="slots"))
    texts, ended = {"a": "", "b": ""}, {k: threading.Event() for k in "ab"}
    held, go = threading.Event(), threading.Event()

    def sink(key):
        def take(events):
            for event in events:
                texts[key] += event[2] if event[0] == "delta" else ""
                if event[0] == "end":
                    texts[key + "_end_step"] = scheduler.steps
                    ended[key].set()
            if key == "a" and not held.is_set():
                held.set()
                go.wait(60)
        return take

    first, second = ask("Who are you?"), ask("What is the capital of France?")
    submit = lambda p, n, k: scheduler.submit(Generation("m", "job0", tok, [Row(0, p, n, [])],   # noqa: E731
                                                         Sampling(temperature=0.0), sink(k)))
    submit(first, 40, "a")
    held.wait(120)
    submit(second, 12, "b")
    go.set()
    ended["a"].wait(120), ended["b"].wait(120)
    scheduler.stop()
    return {"join_check": True, "joins": scheduler.joins, "batches": scheduler.batches,
            "joined_same_as_generate": texts["b"] == generate(second, 12),
            "first_same_as_generate": texts["a"] == generate(first, 40),
            "joined_end_step": texts.get("b_end_step"), "first_end_step": texts.get("a_end_step")}


def timed(run, model, batch, new):
    run(model, batch, min(new, 8))   # warm-up (allocator, lazy inits)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = run(model, batch, new)
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--join-check", action="store_true", help="first: the tiny model's join check")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    if args.join_check:
        print(json.dumps({"device": name, **join_check(device)}), flush=True)
    for shape in args.shapes:
        model = build(shape, device)
        for rows in args.rows:
            batch = prompts(rows, SHAPES[shape]["vocab_size"])
            ours, ours_s = timed(continuous, model, batch, args.new)
            old, old_s = timed(static_loop, model, batch, args.new)
            slot, slot_s = timed(slots, model, batch, args.new)
            same = sum(a == b for x, y in zip(ours, old) for a, b in zip(x, y)) / (rows * args.new)
            slot_same = sum(a == b for x, y in zip(slot, old) for a, b in zip(x, y)) / (rows * args.new)
            line = {"device": name, "shape": shape, "rows": rows, "new_tokens": args.new,
                    "continuous_tokens_per_s": round(rows * args.new / ours_s, 1),
                    "static_graph_tokens_per_s": round(rows * args.new / old_s, 1),
                    "slots_graph_tokens_per_s": round(rows * args.new / slot_s, 1), "same_tokens": round(same, 4),
                    "slots_same_as_static": round(slot_same, 4)}
            print(json.dumps(line), flush=True)
            if args.out:
                with args.out.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
