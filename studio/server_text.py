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
    # studio/context.py: FP8 on a GPU where the fused engine cannot run (the inner reason is translated too)
    "fp8_needs_fused": re.compile(r"FP8 base weights run on the fused engine: (?P<reason>.+)"),
    # jobs/queue/runner.py, jobs/queue/outcome.py: the store's reason for a stopped job
    "cancelled_by_user": re.compile(r"cancelled by the user"),
    "cancelled_before_start": re.compile(r"cancelled before it started"),
    "removed_before_start": re.compile(r"removed before it started"),
}

# The lines of a job's fused-kernel report (kernels/report.py PatchReport.lines, jobs/train/loop.py
# _accelerate): op names and numbers stay as written, the words around them are translated.
REPORT_LINES = {
    "report_off": re.compile(r"fused kernels: off \(PyTorch path\)"),
    "report_head": re.compile(r"fused kernels: backend=(?P<backend>\S+) architecture=(?P<architecture>\S+)"),
    "report_checkpointing": re.compile(r"checkpointing: (?P<policy>.+)"),
    "report_fallback": re.compile(r"torch\s+(?P<op>\S+)(?P<count> x\d+)?: (?P<reason>.+)"),
    "report_note": re.compile(r"note\s+(?P<note>.+)"),
}
CHECKPOINTING = {"off": "report_policy_off", "on: every decoder layer recomputed in backward": "report_policy_on"}


def translated(text: str, lang: str | None) -> str:
    if normalize(lang) == "en" or not text:
        return text
    for name, pattern in PATTERNS.items():
        match = pattern.fullmatch(text.strip())
        if match:
            groups = dict(match.groupdict())
            if groups.get("build") == "a CPU-only build":
                groups["build"] = t("reason.cpu_only_build", lang)
            if name == "fp8_needs_fused":
                groups["reason"] = translated(groups["reason"], lang)
            return t(f"reason.{name}", lang, **groups)
    return text


def report_line(line: str, lang: str | None) -> str:
    """One line of the fused-kernel report in the page's language, its indent kept."""
    if normalize(lang) == "en" or not line.strip():
        return line
    indent, body = line[:len(line) - len(line.lstrip())], line.strip()
    for name, pattern in REPORT_LINES.items():
        match = pattern.fullmatch(body)
        if match:
            groups = {k: v or "" for k, v in match.groupdict().items()}
            if "policy" in groups and groups["policy"] in CHECKPOINTING:
                groups["policy"] = t(f"reason.{CHECKPOINTING[groups['policy']]}", lang)
            if "reason" in groups:
                groups["reason"] = translated(groups["reason"], lang)
            return indent + t(f"reason.{name}", lang, **groups)
    return line
