"""Zip files of datasets for the upload tests: members by name, a symlink when asked, and a small PNG."""
import io
import zipfile


def make_zip(path, members: dict[str, bytes], link: str | None = None):
    """A zip at `path` holding `members`; with `link`, also a symlink of that name to /etc/passwd."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link)
            info.external_attr = (0o120777 << 16)
            archive.writestr(info, "/etc/passwd")
    return path


def png_bytes():
    """An 8x8 red PNG."""
    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, format="PNG")
    return out.getvalue()
