"""Per-dtype tolerances shared by the op tests: fp32 kernels match PyTorch to rounding noise;
fp16 differs by a few ulps because the kernels round once from fp32 where eager PyTorch rounds
after every op."""
import torch

TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-2, "rtol": 1e-2},
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(actual, expected, atol=tol["atol"] * scale, rtol=tol["rtol"] * scale)
