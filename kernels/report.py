"""The report `patch_model` returns: what runs on Triton, what fell back to PyTorch, and why."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class PatchEntry:
    op: str            # e.g. "rms_norm", "rope", "swiglu", "lora_qkv", "fused_linear_cross_entropy"
    modules: int       # how many module instances this entry covers
    backend: str       # "triton" or "torch"
    reason: str = ""   # why it fell back (empty when it runs on Triton)


@dataclass
class PatchReport:
    backend: str                      # the backend asked for after resolving "auto"
    architecture: str | None = None   # the table row that matched (None: unknown architecture)
    entries: list[PatchEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def patched(self, op: str, modules: int) -> None:
        self.entries.append(PatchEntry(op, modules, "triton"))

    def fallback(self, op: str, modules: int, reason: str) -> None:
        self.entries.append(PatchEntry(op, modules, "torch", reason))

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def triton_ops(self) -> list[str]:
        return [e.op for e in self.entries if e.backend == "triton"]

    @property
    def fallbacks(self) -> list[PatchEntry]:
        return [e for e in self.entries if e.backend == "torch"]

    def lines(self) -> list[str]:
        head = f"fused kernels: backend={self.backend} architecture={self.architecture or 'unknown'}"
        out = [head]
        for e in self.entries:
            # the count is left out where the patcher stopped before counting (e.g. no CUDA)
            count = f" x{e.modules}" if e.modules else ""
            if e.backend == "triton":
                out.append(f"  triton  {e.op}{count}")
            else:
                out.append(f"  torch   {e.op}{count}: {e.reason}")
        out.extend(f"  note    {n}" for n in self.notes)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict:
        return asdict(self)
