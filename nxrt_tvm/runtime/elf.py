"""Structural checks of a blob's shared library before dlopen sees it.

The sha256 in `notes` proves the bytes are the ones recorded, not that the
record is honest: a blob whose notes were rewritten with it (a forged or
hand-edited artifact) reaches the loader, and the dynamic loader trusts ELF
headers completely: a segment that runs past the end of the file is a SIGBUS,
an empty dynamic section a SIGSEGV, in the middle of `dlopen`. These checks
refuse such a library with a typed error instead. They are not an
authentication (a well-formed library can still do anything once loaded).
"""

from __future__ import annotations

import struct

__all__ = ["elf_problem"]

_MACHINES = {"x86_64": 62, "aarch64": 183, "riscv64": 243}  # e_machine per LLVM triple arch
_ET_DYN, _PT_LOAD, _PT_DYNAMIC = 3, 1, 2
_SHT_STRTAB, _SHT_NOBITS = 3, 8
_DT_NULL, _DT_STRTAB, _DT_SYMTAB = 0, 5, 6
_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_DYN = struct.Struct("<qQ")


def _segments(blob: bytes, phoff: int, phnum: int) -> list[tuple[int, int, int, int, int]]:
    """(type, offset, vaddr, filesz, memsz) of every program header."""
    out = []
    for k in range(phnum):
        p_type, _flags, offset, vaddr, _paddr, filesz, memsz, _align = _PHDR.unpack_from(
            blob, phoff + k * _PHDR.size
        )
        out.append((p_type, offset, vaddr, filesz, memsz))
    return out


def elf_problem(blob: bytes, arch: str) -> str | None:
    """What makes `blob` unsafe to hand to dlopen as a
    64-bit little-endian shared library of `arch`, or None."""
    size = len(blob)
    if size < _HEADER.size or blob[:4] != b"\x7fELF":
        return "it is not an ELF shared library"
    (
        ident,
        e_type,
        machine,
        _version,
        _entry,
        phoff,
        shoff,
        _flags,
        _ehsize,
        phentsize,
        phnum,
        shentsize,
        shnum,
        shstrndx,
    ) = _HEADER.unpack_from(blob)
    if ident[4] != 2 or ident[5] != 1:
        return "it is not a 64-bit little-endian ELF file"
    if e_type != _ET_DYN:
        return f"its ELF type is {e_type}, not a shared library (3)"
    if arch in _MACHINES and machine != _MACHINES[arch]:
        return f"its ELF machine is {machine}, this host ({arch}) needs {_MACHINES[arch]}"
    if phentsize != _PHDR.size or phnum == 0 or phoff + phnum * _PHDR.size > size:
        return "its program header table is missing or runs past the end of the file"
    segments = _segments(blob, phoff, phnum)
    loads = [s for s in segments if s[0] == _PT_LOAD]
    if not loads:
        return "it has no loadable segment"
    for _type, offset, _vaddr, filesz, memsz in loads:
        if offset + filesz > size or filesz > memsz:
            return (
                f"a loadable segment ({offset}+{filesz} bytes) runs past the end of the file ({size} bytes)"
            )
    dynamic = [s for s in segments if s[0] == _PT_DYNAMIC]
    if len(dynamic) != 1 or dynamic[0][1] + dynamic[0][3] > size or dynamic[0][3] < _DYN.size:
        return "its dynamic section is missing or runs past the end of the file"
    _type, offset, _vaddr, filesz, _memsz = dynamic[0]
    tags: dict[int, int] = {}
    for k in range(filesz // _DYN.size):
        tag, value = _DYN.unpack_from(blob, offset + k * _DYN.size)
        if tag == _DT_NULL:
            break
        tags.setdefault(tag, value)
    for tag, what in ((_DT_STRTAB, "string table"), (_DT_SYMTAB, "symbol table")):
        address = tags.get(tag)
        if address is None:
            return f"its dynamic section names no {what} (empty or zeroed)"
        if not any(v <= address < v + f for _t, _o, v, f, _m in loads):
            return f"its dynamic {what} lies outside the file's loadable segments"
    if shnum:
        if shentsize != _SHDR.size or shoff + shnum * _SHDR.size > size or shstrndx >= shnum:
            return "its section header table runs past the end of the file"
        for k in range(shnum):
            _name, sh_type, _flags, _addr, sh_offset, sh_size, *_ = _SHDR.unpack_from(
                blob, shoff + k * _SHDR.size
            )
            if sh_type != _SHT_NOBITS and sh_offset + sh_size > size:
                return f"section {k} ({sh_offset}+{sh_size} bytes) runs past the end of the file"
        if _SHDR.unpack_from(blob, shoff + shstrndx * _SHDR.size)[1] != _SHT_STRTAB:
            return "its section name table is not a string table (zeroed or corrupt headers)"
    return None
