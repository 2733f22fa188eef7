"""A small, fast reader of GGUF metadata and tensor tables (GGUF v2/v3).

Why not `gguf.GGUFReader`: it builds one numpy view per array element, which takes ~14 s on the
151,936-token Qwen vocabulary (two string arrays of ~150k entries). Walking the same bytes with
`struct` takes well under a second. Tensor data stays memory-mapped and is dequantized with
`gguf.quants.dequantize`, so only the layout is parsed here.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (header, key/value metadata,
tensor infos, aligned data section). Modelled on transformers' `integrations/gguf/reader.py`,
which needs torch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# `_type_traits` maps each type to its dequantizer class (gguf 0.19); `dequantize()` wraps it 16 rows at a time.
from gguf.quants import _type_traits

from .errors import SourceError

# Fixed-size metadata value types (GGUFValueType ids) and their struct formats.
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_PLAIN = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
}


def plain_value(value):
    """A metadata value (`GGUFFile.metadata`) as plain JSON-able Python."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: `shape` in numpy order (GGUF lists dimensions fastest-first)."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """Metadata (`metadata: dict[str, Any]`) and tensors (`tensors: dict[str, TensorInfo]`) of a GGUF.

    String arrays become `list[str]`, numeric arrays `np.ndarray`. `read(name)` dequantizes one
    tensor to float32 (or returns its plain float values) with the numpy shape.

    Raises SourceError (naming the file) when the file is not a GGUF, is truncated, or holds a
    tensor type that cannot be dequantized.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._blob = np.memmap(self.path, mode="r", dtype=np.uint8)
        except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
            raise SourceError(f"{self.path}: cannot read as GGUF ({exc})") from None
        # struct and bytes() on a memoryview are ~5x faster than numpy slicing for the ~300k strings.
        self._view = memoryview(self._blob)  # type: ignore[arg-type]  # numpy's stub: no __buffer__ before 3.12
        if bytes(self._view[:4]) != b"GGUF":
            raise SourceError(f"{self.path}: not a GGUF file (no GGUF magic bytes)")
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError) as exc:
            raise SourceError(f"{self.path}: truncated or corrupt GGUF header ({exc})") from None

    def _parse(self) -> None:
        blob = self._view
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", blob, 4)
        if version not in (2, 3):
            raise SourceError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
        pos, self.metadata = 24, {}
        for _ in range(n_kv):
            key, pos = self._string(pos)
            (vtype,) = struct.unpack_from("<I", blob, pos)
            self.metadata[key], pos = self._value(pos + 4, vtype)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (ndim,) = struct.unpack_from("<I", blob, pos)
            dims = struct.unpack_from(f"<{ndim}Q", blob, pos + 4)
            qtype, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * ndim)
            pos += 4 + 8 * ndim + 12
            infos.append((name, tuple(reversed(dims)), qtype, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (pos + align - 1) // align * align
        self.tensors = {}
        for name, shape, qtype, offset in infos:
            try:
                qtype = GGMLQuantizationType(qtype)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise SourceError(f"{self.path}: tensor {name} has unknown ggml type {qtype}") from None
            nbytes = int(np.prod(shape, dtype=np.int64)) // block * type_size
            start = data_start + offset
            if start + nbytes > len(blob):
                raise SourceError(
                    f"{self.path}: truncated: tensor {name} ends at byte "
                    f"{start + nbytes:,} but the file has {len(blob):,}"
                )
            self.tensors[name] = TensorInfo(name, shape, qtype, start, nbytes)

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._view, pos)
        if pos + 8 + n > len(self._view):
            raise IndexError("string runs past the end of the file")
        return str(self._view[pos + 8 : pos + 8 + n], "utf-8"), pos + 8 + n

    def _value(self, pos: int, vtype: int):
        if vtype in _SCALAR:
            (value,) = struct.unpack_from(_SCALAR[vtype], self._view, pos)
            return value, pos + struct.calcsize(_SCALAR[vtype])
        if vtype == _STRING:
            return self._string(pos)
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", self._view, pos)
            pos += 12
            if etype in _NUMPY:
                dtype = np.dtype(_NUMPY[etype])
                end = pos + count * dtype.itemsize
                if end > len(self._view):
                    raise IndexError("array runs past the end of the file")
                return np.frombuffer(self._view[pos:end], dtype=dtype).copy(), end
            values = []
            for _ in range(count):
                value, pos = self._value(pos, etype)
                values.append(value)
            return values, pos
        raise SourceError(f"{self.path}: unknown metadata value type {vtype}")

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor `name` (uint8, memory-mapped, not copied)."""
        info = self.tensors[name]
        return self._blob[info.offset : info.offset + info.nbytes]

    def read(self, name: str, dtype=np.float32) -> np.ndarray:
        """Tensor `name` as a numpy array of its numpy shape and `dtype` (float32 or float16).

        Quantized rows are dequantized in chunks of ~1M values: `gguf.quants.dequantize` works on
        16 rows at a time, and its per-call overhead made the 0.5B model take ~11 s instead of ~4 s.
        Each chunk is cast to `dtype` while it is still in cache. Raises SourceError for a type
        `gguf.quants` cannot dequantize.
        """
        info = self.tensors[name]
        data = self.raw(name)
        if info.qtype in _PLAIN:
            return data.view(_PLAIN[info.qtype]).reshape(info.shape).astype(dtype, copy=False)
        traits = _type_traits.get(info.qtype)
        if traits is None:
            raise SourceError(f"{self.path}: tensor {name} has type {info.qtype.name}, which cannot be dequantized")
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        width = info.shape[-1]
        rows = data.reshape(-1, width // block * type_size)
        out = np.empty((rows.shape[0], width), dtype=dtype)
        step = max(1, (1 << 20) // width)
        try:
            for i in range(0, rows.shape[0], step):
                out[i : i + step] = traits.dequantize_rows(rows[i : i + step])
        except NotImplementedError:
            raise SourceError(
                f"{self.path}: tensor {name} has type {info.qtype.name}, which cannot be dequantized"
            ) from None
        return out.reshape(info.shape)
