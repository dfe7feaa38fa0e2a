"""kernels/host_embedding.py: the frozen input embedding table in host memory gives the same loss and
LoRA gradients as on the device, says why where it cannot move, and comes back on restore. Here the
"device" is the CPU (no pinning); on the H200 the vision bench runs it within the peer's peak
(bench/results/vision.jsonl)."""
from __future__ import annotations

import peft
import pytest
import torch
import torch.nn.functional as F
import transformers

from kernels.host_embedding import (HOSTED_ATTR, host_input_embeddings, hostable_reason, hosted, hosted_bytes,
                                    remember_host_ids, restore_input_embeddings)
from kernels.step_graph import capturable_reason
from tests.jobs.models.model_shapes import HOST, seven_b, vl_spec


def lora_llama(tied=False):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_a_hosted_table_trains_exactly_as_one_on_the_device():
    model, ids = lora_llama(), torch.randint(0, 101, (2, 13))
    loss, grads = loss_and_grads(model, ids)
    freed = host_input_embeddings(model, device=torch.device("cpu"))
    assert freed == 101 * 48 * 4 and hosted(model) and hosted_bytes(model) == freed
    assert "forward" in vars(model.get_input_embeddings())   # the instance is patched, not nn.Embedding
    hosted_loss, hosted_grads = loss_and_grads(model, ids)
    assert torch.equal(loss, hosted_loss)
    assert grads.keys() == hosted_grads.keys() and all(torch.equal(grads[k], hosted_grads[k]) for k in grads)
    restore_input_embeddings(model)
    table = model.get_input_embeddings()
    assert not hosted(model) and "forward" not in vars(table) and not hasattr(table, HOSTED_ATTR)
    assert torch.equal(loss_and_grads(model, ids)[0], loss)


def test_the_staging_buffer_is_reused_and_never_handed_out():
    """Each forward gathers into one buffer kept on the module and returns a copy of it: an earlier
    forward's rows survive the next gather, and only a longer batch allocates a larger buffer."""
    model = lora_llama()
    host_input_embeddings(model, device=torch.device("cpu"))
    table = model.get_input_embeddings()
    batches = [torch.randint(0, 101, shape) for shape in ((2, 13), (2, 7), (3, 11))]
    outs, stages = [], []
    for ids in batches:
        outs.append(table(ids))
        stages.append(table._fusetune_stage.data_ptr())
    assert stages[0] == stages[1] != stages[2]
    # Compare each output with the buffer alive when it was made: the first buffer is freed once the longer
    # batch replaces it, and the allocator may hand its memory to a later output (CI once saw that).
    for ids, out, stage in zip(batches, outs, stages):
        assert torch.equal(out, F.embedding(ids, table.weight)) and out.data_ptr() != stage
    restore_input_embeddings(model)
    assert not hasattr(model.get_input_embeddings(), "_fusetune_stage")


def test_ids_the_loop_sent_are_gathered_from_their_host_copy():
    """The loop names each micro-batch's host ids beside the device tensor it made of them: the forward that
    receives that very tensor gathers from the host copy (here a different one, to see which was read), any
    other tensor is read back, and a tensor that is gone leaves the list at the next step."""
    model = lora_llama()
    remember_host_ids(model, [(torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.long))])
    assert not hasattr(model.get_input_embeddings(), "_fusetune_host_ids")   # not hosted: nothing kept
    host_input_embeddings(model, device=torch.device("cpu"))
    table = model.get_input_embeddings()
    sent, host = torch.randint(0, 101, (2, 5)), torch.randint(0, 101, (2, 5))
    remember_host_ids(model, [(sent, host)])
    assert torch.equal(table(sent), F.embedding(host, table.weight))
    assert torch.equal(table(sent.clone()), F.embedding(sent, table.weight))
    del sent
    remember_host_ids(model, [])
    assert table._fusetune_host_ids == []


def test_a_table_that_cannot_move_says_why():
    assert "tied to the LM head" in hostable_reason(lora_llama(tied=True))
    model = lora_llama()
    assert hostable_reason(model) == "the table is on cpu, not a CUDA GPU"
    model.get_input_embeddings().weight.requires_grad_(True)
    assert "trained (modules_to_save)" in hostable_reason(model)


def test_a_step_with_a_hosted_table_is_not_captured_and_says_why():
    model = lora_llama()
    host_input_embeddings(model, device=torch.device("cpu"))
    reason = capturable_reason(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                                        capturable=True))
    assert reason is not None and "gathers its rows on the host" in reason


@pytest.mark.parametrize("method", ["sft", "grpo"])
def test_the_budget_hosts_the_table_only_when_no_plan_fits_without_it(monkeypatch, method):
    """Qwen2.5-VL-7B at 4,096 tokens within Unsloth's 16.27 GiB (bench/results/vision.jsonl): no plan fits
    with its untied 1.02 GiB table on the GPU; hosted, the estimate drops by the table. Never for GRPO
    (it generates from the table token by token) nor where a plan fits anyway."""
    from jobs.models import fit
    monkeypatch.setattr("kernels.checkpoint._host_free_bytes", lambda: HOST)
    extra = dict(num_generations=2, max_completion_length=256, max_seq_length=1024) if method == "grpo" else {}
    tight = vl_spec(gradient_checkpointing="auto", max_gpu_memory_gb=16.27, method=method, **extra)
    plan = fit.plan_within_budget(tight, seven_b())
    table = 152064 * 3584 * 2
    estimate = fit.estimate_peak(tight, seven_b(), free_bytes=140 * 2 ** 30)
    if method == "grpo":
        assert plan[3] == 0 and "pinned CPU memory (1.02 GiB)" not in plan[2]
        return
    assert plan[3] == table and plan[2].endswith("input embeddings in pinned CPU memory (1.02 GiB)")
    assert estimate.checkpointing == plan[2] and any("1.02 GiB) stays in pinned CPU memory" in n for n in estimate.notes)
    on_device = vl_spec(gradient_checkpointing="on", max_gpu_memory_gb=16.27)
    assert fit.estimate_peak(on_device, seven_b()).parts["base weights"] - estimate.parts["base weights"] == table
    roomy = fit.plan_within_budget(vl_spec(gradient_checkpointing="auto", max_gpu_memory_gb=40.0), seven_b())
    assert roomy[3] == 0 and "pinned CPU memory (" not in roomy[2]
