"""jobs/models/train_mode.py: a model's training flag set in one flat pass, exactly as train(mode) sets it."""
import gc
import weakref

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from jobs.models.train_mode import set_training


def _lora_model():
    config = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=61)
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules=["q_proj", "down_proj"]))


def test_the_flat_pass_sets_every_module_as_train_does():
    peft = _lora_model()
    peft.base_model.model.model.layers[1].train()   # mixed modes, as from_pretrained under PEFT leaves them
    set_training(peft, False)
    assert not any(m.training for m in peft.modules())
    set_training(peft, True)
    assert all(m.training for m in peft.modules())
    peft.add_module("extra", torch.nn.Dropout(0.1))   # a module added at the top: the list is taken again
    set_training(peft, False)
    assert not peft.extra.training and not peft.training
    gone = weakref.ref(peft)
    del peft
    gc.collect()
    assert gone() is None   # the module list it keeps does not keep the model alive


def test_a_module_with_its_own_train_goes_through_train():
    seen = []

    class Tracked(torch.nn.Linear):
        def train(self, mode=True):   # e.g. a module that syncs state when its mode changes
            seen.append(mode)
            return super().train(mode)

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Tracked(2, 2))
    set_training(model, False)
    assert seen == [False] and not any(m.training for m in model.modules())
