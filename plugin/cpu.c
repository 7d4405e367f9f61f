/* Does this CPU have what a blob was compiled for?
 *
 * nxrt-tvm records the LLVM feature names of the CPU it compiled for
 * (notes.cpu_features). LLVM is not reachable from C here, so each name is
 * sorted into one of three kinds:
 *   - instruction sets compiled code may use: checked with cpuid (and, for
 *     AVX / AVX-512 / AMX, that the OS saves their registers: XGETBV);
 *   - tuning hints and system or intrinsic-only instructions that LLVM never
 *     emits for TVM's kernels (e.g. "fast-lzcnt", "pku", "rdpru"): not a
 *     requirement, skipped — hypervisors often hide the latter;
 *   - anything else: unknown, so the blob is declined with its name.
 */
#include "plugin.h"

#include <pthread.h>

/* LLVM tuning hints: they shape code, they do not require hardware. */
static const char* const TUNING[] = {
    "64bit-mode", "allow-light-256-bit", "branchfusion", "macrofusion", "idivq-to-divl", "idivl-to-divb",
    "sbb-dep-breaking", "nopl", "fsrm", "ermsb", "lea-sp", "lea-uses-ag", "pad-short-functions",
    "use-glm-div-sqrt-costs", "use-slm-arith-costs", "branch-hint", "harden-sls-ijmp", "harden-sls-ret",
    "retpoline", "retpoline-external-thunk", "retpoline-indirect-branches", "retpoline-indirect-calls",
    "lvi-cfi", "lvi-load-hardening", "seses", "inline-asm-use-gpr32", "faster-shift-than-shuffle", "vzeroupper", NULL};
static const char* const TUNING_PREFIX[] = {"fast-", "slow-", "tuning-", "prefer-", "false-deps-", "avoid-", "no-bypass-delay",
                                             NULL};

static bool in_list(const char* const* list, const char* name) {
  for (; *list; list++)
    if (!strcmp(*list, name)) return true;
  return false;
}

static bool has_prefix(const char* const* list, const char* name) {
  for (; *list; list++)
    if (!strncmp(*list, name, strlen(*list))) return true;
  return false;
}

/* Never emitted by LLVM for TVM kernels: system, privileged or intrinsic-only instructions. */
static const char* const NOT_EMITTED[] = {
    "fxsr", "xsave", "xsavec", "xsaveopt", "xsaves", "fsgsbase", "invpcid", "pku", "shstk", "ibt", "rdpid",
    "rdpru", "mwaitx", "monitorx", "clzero", "wbnoinvd", "movdiri", "movdir64b", "prefetchi", "clflushopt",
    "clwb", "sgx", "rtm", "hle", "waitpkg", "serialize", "tsxldtrk", "uintr", "enqcmd", "hreset", "kl",
    "widekl", "cldemote", "ptwrite", "pconfig", "lwp", "prefetchwt1", "cmpccxadd", "raoint", "usermsr",
    "rdrnd", "rdseed", NULL};

bool feature_requires_hardware(const char* name) {
  return !in_list(TUNING, name) && !has_prefix(TUNING_PREFIX, name) && !in_list(NOT_EMITTED, name);
}

static void cpu_model_id(char* out, size_t out_len);

#ifndef NXRT_HOST_CPU
#define NXRT_HOST_CPU ""
#endif
#ifndef NXRT_HOST_CPU_ID
#define NXRT_HOST_CPU_ID ""
#endif

/* The build names this host's CPU (-DNXRT_HOST_CPU, from LLVM) and its model (-DNXRT_HOST_CPU_ID,
 * "vendor/family/model" as /proc/cpuinfo says): a library that runs on another CPU model (a cache shared
 * between hosts, a copied file) knows the name is not its host's and says "unknown". */
const char* host_cpu_name(void) {
  char id[96];
  cpu_model_id(id, sizeof id);
  if (!*NXRT_HOST_CPU || (*NXRT_HOST_CPU_ID && strcmp(id, NXRT_HOST_CPU_ID))) return "unknown";
  return NXRT_HOST_CPU;
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

typedef enum { EAX, EBX, ECX, EDX } reg;
typedef enum { OS_NONE, OS_AVX, OS_AVX512, OS_AMX } os_state;
typedef struct {
  const char* name;
  unsigned leaf, sub;
  reg r;
  int bit;
  os_state os;
} isa_bit;

static const isa_bit ISA[] = {
    {"x87", 1, 0, EDX, 0}, {"cx8", 1, 0, EDX, 8}, {"cmov", 1, 0, EDX, 15}, {"mmx", 1, 0, EDX, 23},
    {"sse", 1, 0, EDX, 25}, {"sse2", 1, 0, EDX, 26},
    {"sse3", 1, 0, ECX, 0}, {"pclmul", 1, 0, ECX, 1}, {"ssse3", 1, 0, ECX, 9}, {"fma", 1, 0, ECX, 12, OS_AVX},
    {"cx16", 1, 0, ECX, 13}, {"sse4.1", 1, 0, ECX, 19}, {"sse4.2", 1, 0, ECX, 20}, {"crc32", 1, 0, ECX, 20},
    {"movbe", 1, 0, ECX, 22}, {"popcnt", 1, 0, ECX, 23}, {"aes", 1, 0, ECX, 25}, {"avx", 1, 0, ECX, 28, OS_AVX},
    {"f16c", 1, 0, ECX, 29, OS_AVX},
    {"bmi", 7, 0, EBX, 3}, {"avx2", 7, 0, EBX, 5, OS_AVX}, {"bmi2", 7, 0, EBX, 8},
    {"avx512f", 7, 0, EBX, 16, OS_AVX512}, {"avx512dq", 7, 0, EBX, 17, OS_AVX512}, {"adx", 7, 0, EBX, 19},
    {"avx512ifma", 7, 0, EBX, 21, OS_AVX512}, {"avx512pf", 7, 0, EBX, 26, OS_AVX512},
    {"avx512er", 7, 0, EBX, 27, OS_AVX512}, {"avx512cd", 7, 0, EBX, 28, OS_AVX512}, {"sha", 7, 0, EBX, 29},
    {"avx512bw", 7, 0, EBX, 30, OS_AVX512}, {"avx512vl", 7, 0, EBX, 31, OS_AVX512},
    {"avx512vbmi", 7, 0, ECX, 1, OS_AVX512}, {"avx512vbmi2", 7, 0, ECX, 6, OS_AVX512}, {"gfni", 7, 0, ECX, 8},
    {"vaes", 7, 0, ECX, 9, OS_AVX}, {"vpclmulqdq", 7, 0, ECX, 10, OS_AVX}, {"avx512vnni", 7, 0, ECX, 11, OS_AVX512},
    {"avx512bitalg", 7, 0, ECX, 12, OS_AVX512}, {"avx512vpopcntdq", 7, 0, ECX, 14, OS_AVX512},
    {"avx512vp2intersect", 7, 0, EDX, 8, OS_AVX512}, {"amx-bf16", 7, 0, EDX, 22, OS_AMX},
    {"avx512fp16", 7, 0, EDX, 23, OS_AVX512}, {"amx-tile", 7, 0, EDX, 24, OS_AMX}, {"amx-int8", 7, 0, EDX, 25, OS_AMX},
    {"sha512", 7, 1, EAX, 0, OS_AVX}, {"sm3", 7, 1, EAX, 1}, {"sm4", 7, 1, EAX, 2, OS_AVX},
    {"avxvnni", 7, 1, EAX, 4, OS_AVX}, {"avx512bf16", 7, 1, EAX, 5, OS_AVX512}, {"amx-fp16", 7, 1, EAX, 21, OS_AMX},
    {"avxifma", 7, 1, EAX, 23, OS_AVX}, {"avxvnniint8", 7, 1, EDX, 4, OS_AVX},
    {"avxneconvert", 7, 1, EDX, 5, OS_AVX}, {"amx-complex", 7, 1, EDX, 8, OS_AMX},
    {"avxvnniint16", 7, 1, EDX, 10, OS_AVX},
    {"sahf", 0x80000001, 0, ECX, 0}, {"lzcnt", 0x80000001, 0, ECX, 5}, {"sse4a", 0x80000001, 0, ECX, 6},
    {"prfchw", 0x80000001, 0, ECX, 8}, {"xop", 0x80000001, 0, ECX, 11, OS_AVX},
    {"fma4", 0x80000001, 0, ECX, 16, OS_AVX}, {"tbm", 0x80000001, 0, ECX, 21}, {"64bit", 0x80000001, 0, EDX, 29},
};


static uint64_t xcr0(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* no OSXSAVE */
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

static bool os_saves(os_state os) {
  uint64_t x = xcr0();
  switch (os) {
    case OS_AVX: return (x & 0x6) == 0x6;
    case OS_AVX512: return (x & 0xE6) == 0xE6;
    case OS_AMX: return (x & 0x60006) == 0x60006;
    default: return true;
  }
}

static bool cpu_has(const isa_bit* f) {
  unsigned r[4] = {0};
  unsigned max = __get_cpuid_max(f->leaf & 0x80000000u, NULL);
  if (max < f->leaf) return false;
  __cpuid_count(f->leaf, f->sub, r[EAX], r[EBX], r[ECX], r[EDX]);
  return ((r[f->r] >> f->bit) & 1u) && os_saves(f->os);
}

const char* host_arch(void) { return "x86_64"; }

static void cpu_model_id(char* out, size_t out_len) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  char vendor[13] = "";
  if (!__get_cpuid(0, &a, &b, &c, &d)) { snprintf(out, out_len, "?"); return; }
  memcpy(vendor, &b, 4); memcpy(vendor + 4, &d, 4); memcpy(vendor + 8, &c, 4);
  __get_cpuid(1, &a, &b, &c, &d);
  unsigned family = (a >> 8) & 0xF, model = (a >> 4) & 0xF; /* as Linux's x86_family / x86_model */
  if (family == 0xF) family += (a >> 20) & 0xFF;
  if (family >= 6) model += ((a >> 16) & 0xF) << 4;
  snprintf(out, out_len, "%s/%u/%u", vendor, family, model);
}

#define N_ISA (sizeof ISA / sizeof ISA[0])
static bool HAVE[N_ISA];
static pthread_once_t probed = PTHREAD_ONCE_INIT;

/* cpuid once per process: in a VM each one traps to the hypervisor, and a fat node asks per variant. */
static void probe(void) {
  for (size_t j = 0; j < N_ISA; j++) HAVE[j] = cpu_has(&ISA[j]);
}

feature_state cpu_feature_state(const char* name) {
  pthread_once(&probed, probe);
  for (size_t j = 0; j < N_ISA; j++)
    if (!strcmp(ISA[j].name, name)) return HAVE[j] ? FEATURE_PRESENT : FEATURE_MISSING;
  if (!feature_requires_hardware(name)) return FEATURE_PRESENT;
  return FEATURE_UNVERIFIABLE;
}

int check_cpu_features(const json* features, const char* built_for, char* why, size_t why_len) {
  if (!features) return 0;
  if (features->kind != JSON_ARRAY) return WHY("notes.cpu_features is not a list");
  char missing[512] = "", unknown[512] = "";
  for (size_t i = 0; i < features->count; i++) {
    const json* f = features->items[i];
    if (f->kind != JSON_STRING) return WHY("notes.cpu_features holds a non-string");
    feature_state state = cpu_feature_state(f->str);
    char* list = state == FEATURE_MISSING ? missing : state == FEATURE_UNVERIFIABLE ? unknown : NULL;
    if (list) {
      size_t used = strlen(list);
      snprintf(list + used, 512 - used, "%s%s", used ? ", " : "", f->str);
    }
  }
  if (*missing)
    return WHY("built for %s, it needs CPU features this host lacks: %s; recompile it on this host "
               "(`nxrt-tvm compile MODEL -o OUT`)", built_for, missing);
  if (*unknown)
    return WHY("built for %s, it needs CPU features the plugin cannot verify: %s; run it with "
               "nxrt_tvm.InferenceSession, or recompile it on this host", built_for, unknown);
  return 0;
}

#else /* not x86: no feature table yet */

const char* host_arch(void) {
#if defined(__aarch64__)
  return "aarch64";
#else
  return "unknown";
#endif
}

static void cpu_model_id(char* out, size_t out_len) { snprintf(out, out_len, "?"); }

feature_state cpu_feature_state(const char* name) {
  (void)name;
  return FEATURE_UNVERIFIABLE; /* as check_cpu_features below: any listed feature is unverifiable here */
}

int check_cpu_features(const json* features, const char* built_for, char* why, size_t why_len) {
  if (features && features->kind == JSON_ARRAY && features->count > 0)
    return WHY("built for %s; the plugin cannot verify CPU features on %s hosts yet; run it with "
               "nxrt_tvm.InferenceSession", built_for, host_arch());
  return 0;
}
#endif
