"""Our `kernels` package shadows Hugging Face's `kernels` (kernel hub) when the repo root is on
sys.path. transformers and bitsandbytes probe for that package; they must behave as without us."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HUB_PROBE = """
import json, sys
import transformers, peft, bitsandbytes
from transformers.utils import is_kernels_available
print(json.dumps({"available": bool(is_kernels_available())}))
"""
# With our repo: first check that `import kernels` is light, then run the same probe.
OUR_PROBE = """
import json, sys
import kernels
light = "transformers" not in sys.modules and "triton" not in sys.modules
names = {n: hasattr(kernels, n) for n in ("__version__", "get_kernel")}
import transformers, peft, bitsandbytes
from transformers.utils import is_kernels_available
ops = [callable(getattr(kernels, n)) for n in ("rms_norm", "rope", "swiglu", "geglu", "patch_model")]
print(json.dumps({"available": bool(is_kernels_available()), "file": kernels.__file__,
                  "light": light, "names": names, "ops": ops}))
"""


def _run(code: str, with_repo: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if with_repo:
        env["PYTHONPATH"] = str(REPO)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO if with_repo else Path("/"),
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_our_kernels_package_does_not_look_like_the_kernel_hub():
    without_repo = _run(HUB_PROBE, with_repo=False)
    with_repo = _run(OUR_PROBE, with_repo=True)
    assert Path(with_repo["file"]).resolve() == REPO / "kernels" / "__init__.py"  # ours was found
    assert with_repo["available"] is False
    assert with_repo["available"] == without_repo["available"]
    assert with_repo["light"], "importing kernels must not import transformers or triton"
    assert with_repo["names"] == {"__version__": False, "get_kernel": False}
    assert with_repo["ops"] == [True] * 5  # the public names still resolve lazily
