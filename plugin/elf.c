/* Structural checks of a blob's shared library before dlopen sees it: the same checks as
 * nxrt_tvm/runtime/elf.py. sha256 in notes proves the bytes are the recorded ones, not that the record
 * is honest; dlopen trusts ELF headers, and a segment past the end of the file (SIGBUS) or an empty dynamic
 * section (SIGSEGV) would kill onnxruntime's process. Not an authentication. */
#include <stdint.h>
#include <string.h>

#include "plugin.h"

#define ET_DYN 3
#define PT_LOAD 1
#define PT_DYNAMIC 2
#define SHT_STRTAB 3
#define SHT_NOBITS 8
#define DT_STRTAB 5
#define DT_SYMTAB 6

static uint64_t rd(const unsigned char* p, int n) { /* little-endian */
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static int machine_of(const char* arch) {
  if (!strcmp(arch, "x86_64")) return 62;
  if (!strcmp(arch, "aarch64")) return 183;
  return -1;
}

int elf_check(const unsigned char* b, size_t size, char* why, size_t why_len) {
  if (size < 64 || memcmp(b, "\x7f" "ELF", 4)) return WHY("it is not an ELF shared library");
  if (b[4] != 2 || b[5] != 1) return WHY("it is not a 64-bit little-endian ELF file");
  if (rd(b + 16, 2) != ET_DYN) return WHY("its ELF type is %u, not a shared library (3)", (unsigned)rd(b + 16, 2));
  int want = machine_of(host_arch());
  if (want >= 0 && rd(b + 18, 2) != (uint64_t)want)
    return WHY("its ELF machine is %u, this host (%s) needs %d", (unsigned)rd(b + 18, 2), host_arch(), want);
  uint64_t phoff = rd(b + 32, 8), shoff = rd(b + 40, 8);
  uint64_t phentsize = rd(b + 54, 2), phnum = rd(b + 56, 2), shentsize = rd(b + 58, 2), shnum = rd(b + 60, 2),
           shstrndx = rd(b + 62, 2);
  if (phentsize != 56 || phnum == 0 || phoff > size || phnum * 56 > size - phoff)
    return WHY("its program header table is missing or runs past the end of the file");
  int loads = 0, dynamics = 0;
  uint64_t dyn_off = 0, dyn_size = 0;
  for (uint64_t k = 0; k < phnum; k++) {
    const unsigned char* ph = b + phoff + k * 56;
    uint64_t type = rd(ph, 4), off = rd(ph + 8, 8), filesz = rd(ph + 32, 8), memsz = rd(ph + 40, 8);
    if (type == PT_LOAD) {
      loads++;
      if (off > size || filesz > size - off || filesz > memsz)
        return WHY("a loadable segment (%llu+%llu bytes) runs past the end of the file (%zu bytes)",
                   (unsigned long long)off, (unsigned long long)filesz, size);
    } else if (type == PT_DYNAMIC) {
      dynamics++;
      dyn_off = off;
      dyn_size = filesz;
    }
  }
  if (!loads) return WHY("it has no loadable segment");
  if (dynamics != 1 || dyn_off > size || dyn_size > size - dyn_off || dyn_size < 16)
    return WHY("its dynamic section is missing or runs past the end of the file");
  uint64_t strtab = 0, symtab = 0;
  int have_strtab = 0, have_symtab = 0;
  for (uint64_t k = 0; k < dyn_size / 16; k++) {
    uint64_t tag = rd(b + dyn_off + k * 16, 8), val = rd(b + dyn_off + k * 16 + 8, 8);
    if (tag == 0) break;
    if (tag == DT_STRTAB && !have_strtab) { strtab = val; have_strtab = 1; }
    if (tag == DT_SYMTAB && !have_symtab) { symtab = val; have_symtab = 1; }
  }
  const char* names[2] = {"string table", "symbol table"};
  uint64_t addrs[2] = {strtab, symtab};
  int have[2] = {have_strtab, have_symtab};
  for (int t = 0; t < 2; t++) {
    if (!have[t]) return WHY("its dynamic section names no %s (empty or zeroed)", names[t]);
    int inside = 0;
    for (uint64_t k = 0; k < phnum && !inside; k++) {
      const unsigned char* ph = b + phoff + k * 56;
      uint64_t vaddr = rd(ph + 16, 8), filesz = rd(ph + 32, 8);
      inside = rd(ph, 4) == PT_LOAD && vaddr <= addrs[t] && addrs[t] - vaddr < filesz;
    }
    if (!inside) return WHY("its dynamic %s lies outside the file's loadable segments", names[t]);
  }
  if (shnum) {
    if (shentsize != 64 || shoff > size || shnum * 64 > size - shoff || shstrndx >= shnum)
      return WHY("its section header table runs past the end of the file");
    for (uint64_t k = 0; k < shnum; k++) {
      const unsigned char* sh = b + shoff + k * 64;
      uint64_t type = rd(sh + 4, 4), off = rd(sh + 24, 8), sz = rd(sh + 32, 8);
      if (type != SHT_NOBITS && (off > size || sz > size - off))
        return WHY("section %llu (%llu+%llu bytes) runs past the end of the file", (unsigned long long)k,
                   (unsigned long long)off, (unsigned long long)sz);
    }
    if (rd(b + shoff + shstrndx * 64 + 4, 4) != SHT_STRTAB)
      return WHY("its section name table is not a string table (zeroed or corrupt headers)");
  }
  return 0;
}
