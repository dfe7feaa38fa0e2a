"""Image-text rows for the vision tests (data, checks, export, train, kernels): the tiny model's
processor parts, builtin:shapes encoded, a dataset file with its images, the two row forms."""
import json
from pathlib import Path

from jobs.data.vision_dataset import vision_examples
from jobs.models import load, vision
from jobs.spec import JobSpec


def processor_parts(folder):
    tokenizer = load.load_tokenizer(str(folder))
    return tokenizer, vision.load_image_processor(str(folder)), vision.image_token(tokenizer)[1]


def encoded_shapes(folder, tmp_path, rows=4, max_length=256):
    """(tokenizer, examples) of builtin:shapes drawn into tmp_path."""
    tokenizer, processor, image_id = processor_parts(folder)
    spec = JobSpec(model=str(folder), dataset="builtin:shapes", max_seq_length=max_length)
    examples = vision_examples(spec, "dataset", tokenizer, processor, image_id, tmp_path / "data", log=lambda _: None)
    return tokenizer, examples[:rows]


def write_dataset(folder: Path, rows: list[dict], images=("a.png",)) -> Path:
    from PIL import Image
    (folder / "imgs").mkdir(parents=True, exist_ok=True)
    for name in images:
        Image.new("RGB", (56, 84), (200, 30, 30)).save(folder / "imgs" / name)
    path = folder / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


PARTS_ROW = {"messages": [
    {"role": "user", "content": [{"type": "image", "image": "imgs/a.png"}, {"type": "text", "text": "What colour?"}]},
    {"role": "assistant", "content": "red"}]}
LLAMA_FACTORY_ROW = {"messages": [{"role": "user", "content": "<image>What colour?"},
                                  {"role": "assistant", "content": "red"}], "images": ["imgs/a.png"]}


def bomb_png(path: Path, side: int = 30000) -> Path:
    """A valid 1-bit grey PNG of side x side black pixels, a few hundred kB on disk (a decompression
    bomb: 2.7 GB as RGB), written row by row without ever holding its pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\0" * (1 + (side + 7) // 8)   # filter byte + packed bits
    body = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def big_png(path: Path, side: int = 8192) -> Path:
    """A side x side 1-bit PNG, small on disk (8192 a side: 64 Mi pixels, 192 MiB as RGB)."""
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("1", (side, side)).save(path)
    return path


def image_row(*references: str) -> dict:
    """An image-text row whose user turn holds these image references."""
    parts = [{"type": "image", "image": ref} for ref in references]
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "How many?"}]},
                         {"role": "assistant", "content": "one"}]}
