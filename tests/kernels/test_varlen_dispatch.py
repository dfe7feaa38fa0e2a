"""How kernels.ops.varlen_attention reaches FlashAttention's varlen kernel ("Dispatch" in its doc): the
aten ops directly, and torch's varlen_attn once this torch refuses their arguments, saying why; a refusal
after calls have worked is raised, not hidden. The kernel itself needs CUDA (bench/check_varlen_dispatch.py
checks it there, bitwise against varlen_attn); here both paths are stand-ins that record their calls."""
import pytest
import torch

from kernels.ops import varlen_attention as op


@pytest.fixture()
def paths(monkeypatch):
    calls = []

    def public(q, k, v, *lengths, scale, window_size, **extra):
        calls.append(("varlen_attn", window_size, extra))
        return q

    class Refusing:
        @staticmethod
        def apply(*args):
            calls.append(("direct",))
            raise TypeError("_flash_attention_forward() got an unexpected keyword argument 'window_size_left'")
    monkeypatch.setattr(op, "_torch_varlen", lambda: (public, "window_size"))
    monkeypatch.setattr(op, "_varlen_takes_enable_gqa", lambda: True)
    monkeypatch.setattr(op, "_FlashVarlen", Refusing)
    monkeypatch.setattr(op, "_direct", {"on": True, "proven": False, "off_reason": None})
    return calls


def _call(heads=4, kv_heads=2):
    q, k, v = torch.zeros(5, heads, 8), torch.zeros(5, kv_heads, 8), torch.zeros(5, kv_heads, 8)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    return op._launch(q, k, v, (cu, cu), (3, 3), 8 ** -0.5, None, True)


def test_a_refused_direct_call_falls_back_to_varlen_attn_once_and_says_why(paths):
    _call()
    _call(heads=2)
    assert [c[0] for c in paths] == ["direct", "varlen_attn", "varlen_attn"]   # tried once, then never again
    assert paths[1][1:] == ((-1, 0), {"enable_gqa": True}) and paths[2][2] == {}   # GQA told only when it is GQA
    assert "window_size_left" in op.direct_off_reason()


def test_a_refusal_after_calls_worked_is_raised(paths):
    op._direct["proven"] = True
    with pytest.raises(TypeError):
        _call()
    assert op.direct_off_reason() is None
