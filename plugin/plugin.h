/* nxrt-tvm's ONNX Runtime plugin EP: shared declarations.
 *
 * ep.c       the ORT plugin-EP ABI: factory, EP, capability, compile, compute glue
 * context.c  reading an EPContext node and the checks that make its blob loadable here
 * cpu.c      host CPU features (cpuid) against the LLVM feature names a blob needs
 * tvm_rt.c   the TVM runtime side: load a blob, run its Relax VM over ORT's buffers
 * json.c, sha256.c  small helpers
 *
 * Conventions: a function that can fail returns 0 on success and writes a
 * human-readable reason into `why` (size `why_len`) otherwise. Every malloc'd
 * object has exactly one owner, named at its declaration.
 */
#ifndef NXRT_TVM_PLUGIN_H_
#define NXRT_TVM_PLUGIN_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnxruntime_c_api.h"
#include <tvm/ffi/c_api.h>

#define NXRT_EP_NAME "TvmExecutionProvider"
#define NXRT_EP_VENDOR "nxrt-tvm"
#define NXRT_EP_VERSION "0.1.0"
#define NXRT_FORMAT_VERSION 1 /* what nxrt_tvm/epcontext/record.py FORMAT_VERSION writes */
#define NXRT_ALIGNMENT 64     /* what TVM-compiled code assumes of its buffers */

#ifndef NXRT_TVM_VERSION
#error "build with -DNXRT_TVM_VERSION=\"<apache-tvm version>\" (nxrt_tvm.ort.build_plugin does)"
#endif
#ifndef NXRT_TVM_RUNTIME_LIB
#define NXRT_TVM_RUNTIME_LIB "libtvm_runtime.so"
#endif

#include <stdarg.h>
/* Writes a reason into `why`; returns 1 (failure) so callers can `return WHY(...)`. */
__attribute__((format(printf, 3, 4))) static inline int why_format(char* why, size_t why_len, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
  return 1;
}
#define WHY(...) why_format(why, why_len, __VA_ARGS__)

/* Releases a failed call's status; true when the call succeeded. */
static inline bool ort_ok(const OrtApi* api, OrtStatus* st) {
  if (!st) return true;
  api->ReleaseStatus(st);
  return false;
}

/* ---- sha256.c ---- */
void sha256_hex(const unsigned char* data, size_t n, char out[65]);

/* ---- json.c ---- */
typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_kind;
typedef struct json {
  json_kind kind;
  double number;       /* JSON_NUMBER, JSON_BOOL */
  char* str;           /* JSON_STRING: owned, NUL-terminated */
  size_t len;          /* JSON_STRING length */
  struct json** items; /* JSON_ARRAY / JSON_OBJECT children: owned */
  char** keys;         /* JSON_OBJECT keys: owned */
  size_t count, cap;
} json;
json* json_parse(const char* text, size_t len); /* NULL when malformed; caller owns the tree */
void json_free(json* v);
const json* json_get(const json* obj, const char* key); /* borrowed */

/* ---- cpu.c ---- */
const char* host_arch(void); /* "x86_64", "aarch64", ... as LLVM's triple spells it */
/* 0 when every feature name in `features` (a JSON array of strings) is present on this CPU. */
int check_cpu_features(const json* features, const char* built_for, char* why, size_t why_len);

/* ---- elf.c ---- */
/* 0 when the blob is a well-formed 64-bit shared library of this host that dlopen can map safely. */
int elf_check(const unsigned char* blob, size_t size, char* why, size_t why_len);

/* ---- context.c ---- */
typedef struct {
  char* partition;         /* owned */
  unsigned char* blob;     /* owned; the verified bytes */
  size_t blob_len;
  size_t num_inputs;       /* data inputs + bound weights, as the node lists them */
  size_t num_outputs;
  int32_t* output_types;   /* owned; ONNX element type of each output */
} nx_context;

/* 1 when `node` is an EPContext node whose `source` names this EP. */
bool is_our_context_node(const OrtApi* api, const OrtNode* node);
/* Reads and checks the node's blob: 0 when loadable. `out` is the caller's either way (context_free). */
int read_context(const OrtApi* api, const OrtGraph* graph, const OrtNode* node, nx_context* out,
                 char* why, size_t why_len);
void context_free(nx_context* ctx);

/* ---- tvm_rt.c ---- */
typedef struct nx_kernel nx_kernel;
int tvm_runtime_init(char* why, size_t why_len);
/* Loads the blob; the kernel copies what it needs from `ctx`. Caller owns the result (kernel_free). */
nx_kernel* kernel_load(const nx_context* ctx, char* why, size_t why_len);
int kernel_run(nx_kernel* k, const OrtApi* api, OrtKernelContext* kc, char* why, size_t why_len);
void kernel_free(nx_kernel* k);

#endif /* NXRT_TVM_PLUGIN_H_ */
