"""Read a ``torch.save`` file without torch (and without running its pickle): tensors become numpy arrays.

SGLang's expert distribution recorder and the vLLM EPLB state are saved with ``torch.save``; the
ingest layer must not import torch (docs/architecture.md). A ``torch.save`` file (torch >= 1.6, the
zip format) is a zip archive ``<name>/data.pkl`` (pickle protocol 2) plus one raw storage per tensor
``<name>/data/<key>`` (``<name>/byteorder``: ``little`` unless it says ``big``). The pickle names
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``, the storage classes
(``torch.LongStorage`` ...) and ``collections.OrderedDict``; storages come back through
``persistent_load(('storage', storage_class, key, location, numel))`` (torch/serialization.py,
``_load``). This unpickler resolves only those names (any other global is refused: nothing in the
file can run code) and builds each tensor as a numpy array of the storage's dtype.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ep_trace.errors import TraceFormatError
from ep_trace.parsers.input_guard import check_inflated, inflate_limit

__all__ = ["load_torch_file"]

#: torch storage class -> numpy dtype (little-endian; bfloat16 is read as its float32 value).
_STORAGES = {
    "DoubleStorage": "f8",
    "FloatStorage": "f4",
    "HalfStorage": "f2",
    "BFloat16Storage": "bf16",
    "LongStorage": "i8",
    "IntStorage": "i4",
    "ShortStorage": "i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
}
_FIX = "save it again with torch.save (zip format, torch >= 1.6) holding only tensors and plain Python data"


class _StorageType:
    def __init__(self, name: str) -> None:
        self.dtype = _STORAGES[name]


def _as_array(raw: bytes, dtype: str, big: bool) -> np.ndarray:
    if dtype == "bf16":  # the high 16 bits of a float32
        u16 = np.frombuffer(raw, dtype=">u2" if big else "<u2").astype(np.uint32)
        return (u16 << 16).view(np.float32)
    if dtype in ("?", "u1", "i1"):
        return np.frombuffer(raw, dtype=dtype)
    return np.frombuffer(raw, dtype=(">" if big else "<") + dtype)


def _rebuild(storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any) -> np.ndarray:
    if not size:
        return storage[offset : offset + 1].reshape(()).copy()
    need = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1 if all(size) else 0
    if need > storage.size:
        raise ValueError(f"tensor of size {list(size)} runs past its storage ({storage.size} elements)")
    if not all(size):
        return np.zeros(size, dtype=storage.dtype)
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=[s * storage.itemsize for s in stride], writeable=False
    )
    return np.array(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, big: bool, path: Path) -> None:
        super().__init__(io.BytesIO(data))
        self._zip, self._prefix, self._big, self._path = archive, prefix, big, path
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise TraceFormatError(
            self._path, f"the pickle names {module}.{name}, which is not a tensor or plain data", _FIX
        )

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise TraceFormatError(self._path, f"unknown persistent id {str(pid)[:80]!r}", _FIX)
        key = str(pid[2])
        if key not in self._storages:
            try:
                raw = self._zip.read(f"{self._prefix}data/{key}")
            except KeyError:
                raise TraceFormatError(self._path, f"storage {key!r} is missing from the archive", _FIX) from None
            self._storages[key] = _as_array(raw, pid[1].dtype, self._big)
        return self._storages[key]


def load_torch_file(path: str | Path) -> Any:
    """The object a ``torch.save`` file holds, with tensors as numpy arrays (module doc).

    Raises:
        TraceFormatError: not a zip-format ``torch.save`` file, a global other than tensors and plain
            data, a storage that is missing or too short, or more bytes than the inflate cap.
    """
    p = Path(path)
    try:
        archive = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError) as exc:
        raise TraceFormatError(p, f"not a torch.save zip archive ({exc})", _FIX) from None
    with archive:
        names = archive.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise TraceFormatError(p, "no data.pkl in the archive", _FIX)
        check_inflated(p, sum(i.file_size for i in archive.infolist()), inflate_limit(p))
        prefix = pkl[: -len("data.pkl")]
        big = prefix + "byteorder" in names and archive.read(prefix + "byteorder").strip() == b"big"
        try:
            return _Unpickler(archive.read(pkl), archive, prefix, big, p).load()
        except TraceFormatError:
            raise
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError, IndexError, AttributeError) as exc:
            raise TraceFormatError(p, f"unreadable pickle ({exc})", _FIX) from None
