"""Sentences the jobs and kernels packages write in English (why an engine cannot run here, ...),
shown in the page's language: each known sentence is matched by a pattern and rendered from the
catalogue key `reason.<name>` with the pattern's groups; anything unknown is shown as written.
jobs/ and kernels/ stay free of the studio's languages (dependencies point studio -> jobs)."""
from __future__ import annotations

import re

from studio.i18n import normalize, t

# name -> the English sentence (jobs/io/telemetry.py, studio/context.py) as a pattern
PATTERNS = {
    "no_cuda": re.compile(r"No CUDA GPU found \(torch (?P<torch>[^,]+), (?P<build>a CPU-only build|CUDA [\w.]+)\): "
                          r"the Triton kernels need an NVIDIA GPU, so training runs on the PyTorch path\."),
    "no_triton": re.compile(r"Triton is not installed \(pip install -r requirements\.txt\); training uses PyTorch\."),
    "old_gpu": re.compile(r"GPU compute capability (?P<capability>[\d.]+) is below 7\.0, which Triton needs\."),
    "triton_on": re.compile(r"Triton kernels available on (?P<gpu>.+)\."),
    "fp8_no_gpu": re.compile(r"FP8 matrix products need a CUDA GPU of compute capability 8\.9 or newer "
                             r"\(Ada, Hopper\); this machine has none\."),
}


def translated(text: str, lang: str | None) -> str:
    if normalize(lang) == "en" or not text:
        return text
    for name, pattern in PATTERNS.items():
        match = pattern.fullmatch(text.strip())
        if match:
            groups = dict(match.groupdict())
            if groups.get("build") == "a CPU-only build":
                groups["build"] = t("reason.cpu_only_build", lang)
            return t(f"reason.{name}", lang, **groups)
    return text
