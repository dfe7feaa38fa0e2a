"""Export: the model card written beside the adapter, and the adapter as a downloadable zip."""
from __future__ import annotations

import zipfile
from pathlib import Path

from jobs.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, JobLayout
from jobs.spec import JobSpec

REQUIRED = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)


class ExportError(RuntimeError):
    pass


def model_card(spec: JobSpec, base_source: str, final_loss: float | None, steps: int,
               status: str = "finished") -> str:
    loss = "n/a" if final_loss is None else f"{final_loss:.4f}"
    config = spec.to_yaml().rstrip()
    return f"""---
library_name: peft
base_model: {base_source}
tags: [fusetune, lora]
---
# LoRA adapter trained with Fusetune Studio

- Base model: `{spec.model}` (loaded from `{base_source}`)
- Dataset: `{spec.dataset}` ({spec.dataset_format})
- Training: {status} after {steps} steps, final loss {loss}
- LoRA: r={spec.lora_r}, alpha={spec.lora_alpha}, dropout={spec.lora_dropout}, targets={spec.target_modules}

## Use it
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel
base = AutoModelForCausalLM.from_pretrained("{base_source}")
model = PeftModel.from_pretrained(base, "path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
```

## Config that ran
```yaml
{config}
```
"""


def export_adapter_zip(job_dir: str | Path) -> Path:
    """Zip the job's adapter folder (the PEFT dir with tokenizer and card) to <job>/<id>-adapter.zip."""
    job_dir = Path(job_dir)
    adapter = JobLayout(job_dir).adapter
    missing = [name for name in REQUIRED if not (adapter / name).is_file()]
    if missing:
        raise ExportError(f"job {job_dir.name} has no finished adapter ({', '.join(missing)} missing); "
                          "wait for it to finish, or cancel it to save the current step")
    target = job_dir / f"{job_dir.name}-adapter.zip"
    tmp = target.with_suffix(".zip.partial")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(adapter.rglob("*")):
            if file.is_file():
                zf.write(file, arcname=f"adapter/{file.relative_to(adapter)}")
    tmp.replace(target)
    return target
