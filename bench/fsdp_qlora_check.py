"""FSDP-QLoRA on the GPU (issue 37): a 4-bit (NF4) base sharded by FSDP2 (jobs/train/sharding.py) gives the
loss and LoRA gradients of the same 4-bit model unsharded, through the fused engine as a job applies it.

One rank over NCCL (world 1: FSDP2's hooks, the bitsandbytes parameter sharded into its DTensor and
gathered back, the module's quant state recovered by bitsandbytes, on a real CUDA device); two CPU ranks
with gloo run in CI (tests/jobs/train/test_sharding.py). As a job loads a sharded base: on the CPU,
quantised there, and moved to the GPU by `fully_shard`. The unsharded reference loads on the GPU, so the
two also differ by where the NF4 codes were made (bitsandbytes' CPU and CUDA quantisers).

    PYTHONPATH=.whl/site python bench/fsdp_qlora_check.py --out bench/results/fsdp_qlora.jsonl

Needs bitsandbytes (carry .whl/site/bitsandbytes to the device) and the tiny model builder (tests/tiny.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DTYPE = torch.bfloat16   # --dtype float32: the compute dtype (and NF4 storage), to tell rounding from a bug
FOUR_BIT = True          # --base bf16: the same check on a bf16 base (issue 37's "FSDP on one GPU equal to none")


def _lora_model(folder: Path, device: torch.device, sharded: bool = False):
    from jobs.models import load as models
    from jobs.spec import JobSpec
    torch.manual_seed(0)
    base = models.load_base_model(str(folder), DTYPE, device, load_in_4bit=FOUR_BIT, sharded=sharded)
    model = models.add_lora(base, JobSpec(model=str(folder), lora_r=8, load_in_4bit=FOUR_BIT))
    with torch.no_grad():   # a LoRA that changes the output, so its gradients are not all zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    return model


def _step(model, ids: torch.Tensor, patch: bool = True) -> tuple[float, torch.Tensor, list[str]]:
    """One forward and backward; `patch=False` leaves the model as PEFT + bitsandbytes run it."""
    from jobs.train import sharding
    from kernels import patch_model
    report = patch_model(model, backend="auto").lines() if patch else ["unpatched: PEFT + bitsandbytes"]
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = torch.cat([sharding.full_tensor(p.grad).float().flatten().cpu()
                       for p in model.parameters() if p.requires_grad])
    return loss.item(), grads, report


def check(folder: Path) -> dict:
    import torch.distributed as dist

    from jobs.train import sharding
    from jobs.train.distributed import Distributed
    cuda = torch.cuda.is_available()   # without: a CPU smoke run of this script (gloo)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    ids = torch.randint(3, 300, (4, 256), generator=torch.Generator().manual_seed(5)).to(device)
    ref_loss, ref_grads, ref_report = _step(_lora_model(folder, device), ids)
    # a second reference without our kernels: the sharded model's 4-bit layers run the torch path
    # (their fused NF4 kernel stands aside under FSDP), so this says which of the two a gap comes from
    plain_loss, plain_grads, _ = _step(_lora_model(folder, device), ids, patch=False)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1, **({"device_id": device} if cuda else {}))
    try:
        model = _lora_model(folder, torch.device("cpu"), sharded=True)   # as a sharded job loads its base
        group = Distributed(rank=0, world_size=1, device=device, backend=backend)
        line = sharding.shard_model(model, group, log=lambda _: None)
        loss, grads, report = _step(model, ids)
        weights = sharding.gathered_weights(model)
    finally:
        dist.destroy_process_group()
    rel = ((grads - ref_grads).norm() / ref_grads.norm()).item()
    rel_plain = ((grads - plain_grads).norm() / plain_grads.norm()).item()
    fused_vs_plain = ((ref_grads - plain_grads).norm() / plain_grads.norm()).item()
    return {"check": "fsdp_qlora_one_rank", "dtype": str(DTYPE), "base": "nf4" if FOUR_BIT else "bf16", "loss": loss, "reference_loss": ref_loss,
            "loss_rel": abs(loss - ref_loss) / abs(ref_loss), "grad_rel": rel,
            "plain_loss": plain_loss, "grad_rel_to_plain": rel_plain, "fused_ref_grad_rel_to_plain": fused_vs_plain,
            "lora_tensors_gathered": len(weights or {}),
            "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None, "device": str(device),
            "shard_line": line, "report": report, "reference_report": ref_report,
            "ok": abs(loss - ref_loss) / abs(ref_loss) < 2e-2 and min(rel, rel_plain) < 5e-2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--base", default="nf4", choices=["nf4", "bf16"], help="the frozen base: 4-bit NF4 or plain")
    args = parser.parse_args()
    global DTYPE, FOUR_BIT
    DTYPE, FOUR_BIT = getattr(torch, args.dtype), args.base == "nf4"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    from tests.tiny import make_tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_model(Path(tmp) / "tiny", hidden=256, layers=2)
        try:
            result = check(folder)
        except Exception as exc:   # noqa: BLE001 - the failure is the result
            result = {"check": "fsdp_qlora_one_rank", "ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-3000:]}
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
