"""Lay a prebuilt llama.cpp library under llama-cpp-python's bindings, so installing needs no compiler.

``make install`` runs this file as a script (before metaroles is installed: it imports only the
standard library)::

    python metaroles/llm/prebuilt_llama.py WHEEL LIB_DIR

``WHEEL`` is a wheel of ``llama-cpp-py-sync`` (CPU build of llama.cpp, from the package index);
its shared libraries are copied into ``LIB_DIR`` (``site-packages/llama_cpp/lib``, where the
bindings of a llama-cpp-python installed with ``LLAMA_BUILD=OFF`` look for them), each under the
names the bindings and the libraries' own ``NEEDED`` entries use.

Those wheels are built against glibc 2.38, whose only new functions they call are the C23 entry
points of ``strtol``, ``strtoul``, ``strtoull`` and ``sscanf`` (``__isoc23_*``: the same functions
that also read a ``0b`` prefix, which llama.cpp never parses). Where the C library is older (Debian
12: 2.36), each such import is renamed in place to the classic function and its version need is
pointed at the baseline ``GLIBC_2.2.5``, which every x86-64 glibc has. Any other need the C
library cannot meet is left alone: the library then fails to load, and ``make`` builds llama.cpp
from source instead.
"""

from __future__ import annotations

import os
import struct
import sys
import zipfile
from pathlib import Path

C23 = b"__isoc23_"
"""The prefix of glibc 2.38's C23 variants of the number-reading functions."""
NEWER = b"GLIBC_2.38"
BASELINE = b"GLIBC_2.2.5"
_SHT_DYNSYM, _SHT_VERNEED, _SHT_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF


class _Elf:
    """The sections of a 64-bit little-endian ELF shared library, read from its bytes."""

    def __init__(self, data: bytearray) -> None:
        if data[:6] != b"\x7fELF\x02\x01":
            raise ValueError("not a 64-bit little-endian ELF file")
        self.data = data
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        self.sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def of_type(self, kind: int) -> tuple[int, ...]:
        return next(s for s in self.sections if s[1] == kind)

    def string(self, table: int, offset: int) -> bytes:
        start = self.sections[table][4] + offset
        return bytes(self.data[start : self.data.index(b"\0", start)])


def _elf_hash(name: bytes) -> int:
    h = 0
    for byte in name:
        h = (h << 4) + byte
        g = h & 0xF0000000
        h = (h ^ (g >> 24)) & ~g & 0xFFFFFFFF
    return h


def fit_to_older_glibc(data: bytearray) -> int:
    """Rename the library's ``__isoc23_*`` imports to the classic functions; how many were renamed."""
    elf = _Elf(data)
    verneed = elf.of_type(_SHT_VERNEED)
    strtab = verneed[6]
    auxes: dict[bytes, tuple[int, int]] = {}  # version name -> (offset of its aux entry, its index)
    at = verneed[4]
    while True:
        _, count, _, aux, following = struct.unpack_from("<HHIII", data, at)
        entry = at + aux
        for _ in range(count):
            _, _, other, name, step = struct.unpack_from("<IHHII", data, entry)
            auxes[elf.string(strtab, name)] = (entry, other)
            entry += step
        if not following:
            break
        at += following
    if NEWER not in auxes or BASELINE not in auxes:
        return 0
    newer, baseline = auxes[NEWER], auxes[BASELINE]
    dynsym, versym = elf.of_type(_SHT_DYNSYM), elf.of_type(_SHT_VERSYM)
    renamed = 0
    for index in range(dynsym[5] // 24):
        (name,) = struct.unpack_from("<I", data, dynsym[4] + index * 24)
        (version,) = struct.unpack_from("<H", data, versym[4] + index * 2)
        if version & 0x7FFF != newer[1]:
            continue
        text = elf.string(dynsym[6], name)
        if not text.startswith(C23):
            raise ValueError(f"the library needs {text.decode()}@GLIBC_2.38, which this C library lacks")
        start = elf.sections[dynsym[6]][4] + name
        data[start : start + len(text) - len(C23) + 1] = text[len(C23) :] + b"\0"
        renamed += 1
    _, _, _, baseline_name, _ = struct.unpack_from("<IHHII", data, baseline[0])
    struct.pack_into("<IHHI", data, newer[0], _elf_hash(BASELINE), 0, newer[1], baseline_name)
    return renamed


def glibc_lacks_2_38() -> bool:
    """Whether the C library here is older than 2.38."""
    release = os.confstr("CS_GNU_LIBC_VERSION") or ""
    major, _, minor = release.removeprefix("glibc ").partition(".")
    return major.isdigit() and minor.isdigit() and (int(major), int(minor)) < (2, 38)


def lay(wheel: Path, lib_dir: Path) -> list[str]:
    """Copy the wheel's shared libraries into ``lib_dir`` (fitted to an older glibc); the names written."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    written: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            base = member.rsplit("/", 1)[-1]
            if not base.startswith("lib") or ".so" not in base:
                continue
            data = bytearray(archive.read(member))
            if glibc_lacks_2_38():
                fit_to_older_glibc(data)
            for name in {base, base.removesuffix(".0")}:  # libggml.so.0 is NEEDED; the bindings open libggml.so
                (lib_dir / name).write_bytes(data)
                written.add(name)
    return sorted(written)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python prebuilt_llama.py WHEEL LIB_DIR")
    print(f"prebuilt llama.cpp: {', '.join(lay(Path(sys.argv[1]), Path(sys.argv[2])))}")
