"""Sentences the jobs and kernels packages write in English (why an engine cannot run here, a bad
row, a refused export, ...), shown in the page's language: each known sentence is matched by a
pattern and rendered from the catalogue with the pattern's groups; anything unknown is shown as
written. jobs/ and kernels/ stay free of the studio's languages (dependencies point studio -> jobs).

Two sources of patterns: the hand-written `reason.<name>` ones below (kernels, telemetry), and one
derived from each template of jobs/messages/ (rendered from `msg.<key>`), so a new message needs
no pattern here, only its Chinese in studio/locales/zh-CN.json."""
from __future__ import annotations

import functools
import re
from string import Formatter

from jobs.messages import MESSAGES
from jobs.spec import JobSpec
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
    "report_loss_rows": re.compile(r"loss: label rows only through the LM head "
                                   r"\(the prompt's and padding's logits are skipped\)"),
    "report_loss_own": re.compile(r"loss: transformers' own, every position through the LM head \((?P<reason>.+)\)"),
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
    return _message(text.strip(), lang, 0) or text


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


# What a jobs/messages/ placeholder can hold, by its name (see that module's docstring): numbers,
# a row's place, and the "; "-joined lists the code makes (split again at the same join).
NUMBER = r"\d[\d,]*"
NUMBER_NAMES = {"number", "line", "count", "column", "offset", "limit", "shown", "turn", "header_count", "length",
                "width", "height", "placeholders", "rank", "step", "index"}
WHERE = r"row \d[\d,]*(?: \([^()]*\)){0,2}|.+?'s header line|it"
LIST_SPLITS = {"problems": re.compile(r"; (?=row \d)"),   # jobs/data/dataset.py Problems.error
               "findings": re.compile(r"; (?=\w+: )"),     # jobs/checks/preflight.py PreflightReport.error
               "gpu_reasons": re.compile(r"; (?=GPU \d)")}  # jobs/io/gpus.py place: one reason per GPU
# `field` is a config key (a SpecError's in a job's error event): only JobSpec's own, longest first, so
# "{field}: {message}" never reads a file name or a row's place as a field
FIELD = "|".join(sorted(map(re.escape, JobSpec.field_names()), key=len, reverse=True))
LIST_JOIN = "；"
FRAMES = {"problems", "findings", "problem", "message"}   # placeholders that hold another message
MAX_DEPTH = 4   # a message inside a message inside ...: real ones nest two or three deep


def _group(name: str, spec: str) -> str:
    if name == "where":
        return WHERE
    if name == "field":
        return f"(?:{FIELD})"
    if name == "config_file":   # a job's config.yaml (jobs/io/layout.py CONFIG_FILE): not any "x: y"
        return r".+?config\.yaml"
    if name in NUMBER_NAMES or spec.endswith((",", "d")):
        return NUMBER
    return ".+?"


def message_pattern(template: str) -> re.Pattern:
    """A jobs/messages/ template as a pattern: the words as written, each placeholder a named
    group (a placeholder used twice must hold the same text twice)."""
    parts, seen = [], set()
    for literal, name, spec, _conversion in Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is None:
            continue
        parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>{_group(name, spec or '')})")
        seen.add(name)
    return re.compile("".join(parts), re.DOTALL)


@functools.cache
def message_matchers() -> list[tuple[str, str, re.Pattern]]:
    """(key, the template's longest run of words, pattern), in the order they are tried: frames
    first (a template that holds another message, so "A (also: B)" is not read as a B whose first
    word is "A (also: ..."), then the one with the most words of its own, so a generic template
    never swallows a sentence that a longer one names."""
    out = []
    for key, template in MESSAGES.items():
        parsed = list(Formatter().parse(template))
        words = [literal for literal, *_ in parsed]
        frame = any(name in FRAMES for _, name, _, _ in parsed)
        out.append((not frame, -sum(map(len, words)), key, max(words, key=len), message_pattern(template)))
    out.sort(key=lambda item: item[:2])
    return [(key, anchor, pattern) for *_order, key, anchor, pattern in out]


def _message(text: str, lang: str | None, depth: int) -> str | None:
    """`text` rendered from its template's `msg.<key>` in `lang`, or None when no template fits."""
    if depth > MAX_DEPTH:
        return None
    for key, anchor, pattern in message_matchers():
        if anchor not in text:   # a cheap test first: most templates share no words with the text
            continue
        match = pattern.fullmatch(text)
        if match:
            values = {name: _value(name, value, lang, depth) for name, value in match.groupdict().items()}
            return t(f"msg.{key}", lang, **values)
    return None


def _value(name: str, value: str, lang: str | None, depth: int) -> str:
    """A placeholder's text in `lang`: numbers as they are, a joined list piece by piece, any other
    value that is itself a known sentence translated too."""
    if name in NUMBER_NAMES:
        return value
    if name in LIST_SPLITS:
        pieces = LIST_SPLITS[name].split(value)
        if name == "findings":   # "key: message" pieces: the field name stays, the message translates
            return LIST_JOIN.join(_finding(piece, lang, depth) for piece in pieces)
        return LIST_JOIN.join(_message(piece, lang, depth + 1) or piece for piece in pieces)
    return _message(value, lang, depth + 1) or value


def _finding(piece: str, lang: str | None, depth: int) -> str:
    key, sep, message = piece.partition(": ")
    return f"{key}{sep}{_message(message, lang, depth + 1) or message}" if sep else piece
