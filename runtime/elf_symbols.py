"""Drop a prefix from the exported symbols of an ELF64 little-endian shared library, in memory.

`scipy-openblas32` (the OpenBLAS of NumPy/SciPy's wheels, self-contained: no libgfortran needed) exports
`scipy_cblas_sgemm`, `scipy_sgetrf_`, ... where MLX asks the dynamic loader for `cblas_sgemm`,
`sgetrf_`. `unprefix` turns a copy of that library into one that exports the plain names, so
`runtime.blas` can load it like a system OpenBLAS. x86-64 and aarch64 are both ELF64 little-endian.

How: each renamed symbol's name offset (`st_name`, into `.dynstr`) moves past the prefix, so
`scipy_cblas_sgemm\\0` is read as `cblas_sgemm\\0` (no string is written; symbol indices, relocations
and version tables are untouched). The loader finds a name through `.gnu.hash`, whose chains hold each
hashed symbol's hash in `.dynsym` order grouped by bucket; new names have new hashes, and the symbols
cannot be reordered, so the table is rewritten in place with one bucket (a chain through all hashed
symbols, in their order) and a Bloom filter of the new hashes (the same size as before, so names this
library lacks are still mostly turned away without a walk). The new table is smaller than the old.
Format: the System V gABI (ELF64 header, section headers, `Elf64_Sym`) and the GNU hash section as
glibc's `dl-lookup.c` reads it (`dl_new_hash`, ELF64 Bloom words of 64 bits, two bits per symbol).
"""

from __future__ import annotations

import struct

SHT_DYNSYM = 11
SHT_GNU_HASH = 0x6FFFFFF6
SHN_UNDEF = 0


class ElfError(ValueError):
    """The file is not an ELF64 little-endian shared library with `.dynsym` and `.gnu.hash`."""


def gnu_hash(name: bytes) -> int:
    """The GNU hash of a symbol name (glibc `dl_new_hash`: h = h * 33 + c from 5381, 32 bits)."""
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


def _sections(data: bytearray) -> list[tuple[int, ...]]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not an ELF64 little-endian file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
    return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def dynamic_symbols(data: bytearray) -> list[tuple[bytes, bool]]:
    """Each `.dynsym` entry's name and whether it is defined here (index order)."""
    secs = _sections(data)
    dynsym = next((s for s in secs if s[1] == SHT_DYNSYM), None)
    if dynsym is None:
        raise ElfError("no .dynsym section")
    strtab = secs[dynsym[6]][4]
    out = []
    for i in range(dynsym[5] // dynsym[9]):
        st_name, _, _, shndx = struct.unpack_from("<IBBH", data, dynsym[4] + i * dynsym[9])
        start = strtab + st_name
        out.append((bytes(data[start : data.index(b"\0", start)]), shndx != SHN_UNDEF))
    return out


def unprefix(data: bytearray, prefix: bytes) -> int:
    """Rename every defined dynamic symbol `prefix + name` to `name` in `data` (a whole library
    file, changed in place) and rewrite `.gnu.hash` to match. Returns how many were renamed.

    Raises ElfError for a file that is not an ELF64 little-endian library with `.dynsym` and
    `.gnu.hash`, or where a plain name would clash with a name the library already exports.
    """
    secs = _sections(data)
    dynsym = next((s for s in secs if s[1] == SHT_DYNSYM), None)
    table = next((s for s in secs if s[1] == SHT_GNU_HASH), None)
    if dynsym is None or table is None:
        raise ElfError("no .dynsym or no .gnu.hash section")
    symbols = dynamic_symbols(data)
    defined = {name for name, is_defined in symbols if is_defined}
    names = []
    renamed = 0
    for i, (name, is_defined) in enumerate(symbols):
        if is_defined and name.startswith(prefix):
            name = name[len(prefix) :]
            if name in defined:
                raise ElfError(f"{name.decode()} is exported both with and without the prefix")
            entry = dynsym[4] + i * dynsym[9]
            (st_name,) = struct.unpack_from("<I", data, entry)
            struct.pack_into("<I", data, entry, st_name + len(prefix))
            renamed += 1
        names.append(name)
    start, size = table[4], table[5]
    _nbuckets, symoffset, bloom_size, shift = struct.unpack_from("<IIII", data, start)
    hashes = [gnu_hash(name) for name in names[symoffset:]]
    bloom = [0] * bloom_size
    for h in hashes:
        bloom[(h // 64) % bloom_size] |= (1 << (h % 64)) | (1 << ((h >> shift) % 64))
    chain = [h & ~1 for h in hashes]
    if chain:
        chain[-1] |= 1  # the end of the one bucket's chain
    if 16 + 8 * bloom_size + 4 + 4 * len(chain) > size:
        raise ElfError(".gnu.hash too small for one bucket")  # never: the old table had >= 1 bucket
    struct.pack_into("<IIII", data, start, 1, symoffset, bloom_size, shift)
    struct.pack_into(f"<{bloom_size}Q", data, start + 16, *bloom)
    buckets = start + 16 + 8 * bloom_size
    struct.pack_into("<I", data, buckets, symoffset if chain else 0)
    struct.pack_into(f"<{len(chain)}I", data, buckets + 4, *chain)
    return renamed


def lookup(data: bytearray, name: bytes, symbols: list[tuple[bytes, bool]] | None = None) -> int | None:
    """The `.dynsym` index the loader would find for `name` through `.gnu.hash` (as glibc's
    `do_lookup_x` walks it), or None: a check of `unprefix`'s table, no loading needed.
    `symbols`: `dynamic_symbols(data)` when the caller has it (many lookups)."""
    secs = _sections(data)
    table = next(s for s in secs if s[1] == SHT_GNU_HASH)
    symbols = symbols if symbols is not None else dynamic_symbols(data)
    start = table[4]
    nbuckets, symoffset, bloom_size, shift = struct.unpack_from("<IIII", data, start)
    h = gnu_hash(name)
    (word,) = struct.unpack_from("<Q", data, start + 16 + 8 * ((h // 64) % bloom_size))
    if not (word >> (h % 64)) & (word >> ((h >> shift) % 64)) & 1:
        return None
    buckets = start + 16 + 8 * bloom_size
    (i,) = struct.unpack_from("<I", data, buckets + 4 * (h % nbuckets))
    if i == 0:
        return None
    chains = buckets + 4 * nbuckets
    while True:
        (value,) = struct.unpack_from("<I", data, chains + 4 * (i - symoffset))
        if (value ^ h) >> 1 == 0 and symbols[i][0] == name:
            return i
        if value & 1:
            return None
        i += 1
