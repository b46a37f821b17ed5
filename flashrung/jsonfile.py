"""JSON files, plain or gzip-compressed.

Every ``--json PATH`` the CLI writes and every stored result it reads (``--from-json``,
``--calibration``, ``flashrung model --against``) goes through here: a path ending in ``.gz`` is
written compressed, and a file is read either way (its first bytes say which). The results kept in
``docs/results`` are stored compressed: indented JSON of per-block timings shrinks 5–10×.
"""
from __future__ import annotations

import gzip
import json
import pathlib
from typing import Any

GZIP_SUFFIX = ".gz"
# A fixed header time keeps a rewritten file byte-identical when its content is
_GZIP_MTIME = 0
_GZIP_MAGIC = b"\x1f\x8b"


def is_compressed(path: str | pathlib.Path) -> bool:
    return str(path).endswith(GZIP_SUFFIX)


def sibling(path: str | pathlib.Path, suffix: str) -> pathlib.Path:
    """A file beside a JSON result with ``suffix`` in place of ``.json`` or ``.json.gz`` (its plot)."""
    path = pathlib.Path(path)
    if is_compressed(path):
        path = path.with_suffix("")
    return path.with_suffix(suffix)


def read(path: str | pathlib.Path) -> Any:
    """The JSON document at ``path``, gzip-compressed or not: the file's first bytes decide, so a
    result renamed without its ``.gz`` (or given one it lacks) still reads."""
    path = pathlib.Path(path)
    raw = path.read_bytes()
    if raw.startswith(_GZIP_MAGIC):
        raw = gzip.decompress(raw)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: expected a JSON document, plain or gzip-compressed ({exc})") from None


def write(doc: Any, path: str | pathlib.Path, *, indent: int | None = 1, default=None) -> pathlib.Path:
    """Write ``doc`` to ``path``, creating its folder; gzip-compressed when the name ends in ``.gz``."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=indent, default=default)
    if is_compressed(path):
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=_GZIP_MTIME) as f:
            f.write(text.encode("utf-8"))
    else:
        path.write_text(text, encoding="utf-8")
    return path
