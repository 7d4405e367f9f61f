/* nxrt-tvm's ONNX Runtime plugin EP: shared declarations.
 *
 * ep.c       the ORT plugin-EP ABI: factory, EP, capability, compile, compute glue
 * context.c  reading an EPContext node and the checks that make its blob loadable here
 * cpu.c      host CPU features (cpuid) against the LLVM feature names a blob needs
 * variant.c  a fat node's CPU variants: which one this host runs best; onnxruntime's compatibility verdict
 * signature.c  the model's signature (MODEL.sig) and the session's trusted keys (OpenSSL's libcrypto)
 * pack.c     a blob's parts: its library and the constants lifted out of it
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
#define NXRT_FORMAT_VERSION 3 /* what nxrt_tvm/epcontext/record.py FORMAT_VERSION writes */
#define NXRT_FAT_FORMAT_VERSION 4 /* record.py FAT_FORMAT_VERSION: one blob per CPU target (notes.variants) */
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
typedef struct {
  uint32_t h[8];
  unsigned char buf[64];
  size_t used;
  uint64_t total;
  void* evp;   /* OpenSSL's digest context where the plugin links it (sha256.c) */
  bool failed; /* OpenSSL reported an error: the digest is "" */
} sha256_ctx;
void sha256_init(sha256_ctx* c);
void sha256_update(sha256_ctx* c, const unsigned char* data, size_t n);
void sha256_final(sha256_ctx* c, char out[65]);
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
json* json_new(json_kind kind);                         /* caller owns; NULL when out of memory */
json* json_new_string(const char* s);                   /* a copy of `s`; caller owns */
/* Appends `child` (owned by `parent` from now on, freed here on failure) under `key` (copied; objects). */
int json_add(json* parent, const char* key, json* child);
/* Python's json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=True); caller frees.
 * NULL when out of memory, or when `v` holds what that text cannot be rebuilt from here: a number
 * that is not an integer (up to 2^53), a key twice, a string that is not UTF-8. */
char* json_canonical(const json* v);

/* ---- cpu.c ---- */
const char* host_arch(void); /* "x86_64", "aarch64", ... as LLVM's triple spells it */
/* LLVM's name for this CPU (e.g. "znver5"), given at build time (-DNXRT_HOST_CPU, as
 * tvm.target.codegen.llvm_get_system_cpu() says); "unknown" when the library runs on another CPU model. */
const char* host_cpu_name(void);
/* Whether code built with this LLVM feature needs it in hardware (as nxrt_tvm.lower.target.requires_hardware). */
bool feature_requires_hardware(const char* name);
typedef enum { FEATURE_PRESENT, FEATURE_MISSING, FEATURE_UNVERIFIABLE } feature_state;
/* PRESENT also for tuning hints and instructions LLVM never emits for TVM's kernels (see cpu.c). */
feature_state cpu_feature_state(const char* name);
/* 0 when every feature name in `features` (a JSON array of strings) is present on this CPU. */
int check_cpu_features(const json* features, const char* built_for, char* why, size_t why_len);

/* ---- elf.c ---- */
/* 0 when the blob is a well-formed 64-bit shared library of this host that dlopen can map safely. */
int elf_check(const unsigned char* blob, size_t size, char* why, size_t why_len);

/* ---- pack.c ---- */
typedef struct {
  size_t offset;    /* from the blob's start */
  size_t nbytes;
  DLDataType dtype;
  int32_t ndim;
  int64_t* shape;   /* owned */
} nx_constant;
typedef struct {
  size_t library_offset, library_len; /* the shared library within the blob */
  size_t num_constants;
  nx_constant* constants;             /* owned: the constants lifted out of the library, in call order */
} nx_layout;
/* The parts of a blob (a library alone is one part and no constants): 0 when its index is well formed and
 * every part lies inside it. `out` is the caller's either way (layout_free). */
int blob_layout(const unsigned char* blob, size_t len, nx_layout* out, char* why, size_t why_len);
void layout_free(nx_layout* l);

/* ---- signature.c ---- */
typedef struct nx_policy nx_policy; /* the session's trusted keys and whether a signature is required */
typedef struct nx_trust nx_trust;   /* what one model's signature vouches for */
/* Reads nxrt.trusted_keys and nxrt.require_signature from the session options: 0 and `*out` (the
 * caller's: policy_free) when usable; 1 with a reason (a key file unreadable, a bad flag) otherwise. */
int policy_load(const OrtApi* api, const OrtSessionOptions* options, nx_policy** out, char* why, size_t why_len);
void policy_free(nx_policy* p);
/* The model's signature file, checked under `policy` (NULL: none required, no keys); `model_path` NULL or
 * empty for a model given as bytes. Never NULL unless out of memory; the caller owns it (trust_free). */
nx_trust* trust_model(const nx_policy* policy, const char* model_path);
/* 0 when the signature vouches for a node's blob (`external_path`: the node's relative blob path, NULL
 * for an embedded blob, which the model's own digest covers); a reason and its remedy otherwise. */
int trust_check_blob(const nx_trust* trust, const char* external_path, const unsigned char* blob, size_t len,
                     char* why, size_t why_len);
void trust_free(nx_trust* t);

/* ---- context.c ---- */
typedef struct {
  char* partition;         /* owned */
  char* variant;           /* owned; of a fat node, the CPU variant loaded and why (as describe_choice) */
  unsigned char* blob;     /* owned; the verified bytes */
  size_t blob_len;
  size_t num_inputs;       /* data inputs + bound weights, as the node lists them */
  size_t num_outputs;
  int32_t* output_types;   /* owned; ONNX element type of each output */
} nx_context;

/* 1 when `node` is an EPContext node whose `source` names this EP. */
bool is_our_context_node(const OrtApi* api, const OrtNode* node);
/* Reads and checks the node's blob (against `trust`, NULL: unsigned and allowed, then this host): 0 when
 * loadable. `out` is the caller's either way (context_free). */
int read_context(const OrtApi* api, const OrtGraph* graph, const OrtNode* node, const nx_trust* trust,
                 nx_context* out, char* why, size_t why_len);
void context_free(nx_context* ctx);
/* The node's compatibility string (as nxrt_tvm/epcontext/compat.py compatibility_info); caller frees; NULL
 * when the node's notes are unreadable. */
char* context_compatibility_info(const OrtApi* api, const OrtNode* node);

/* ---- variant.c ---- */
/* Of a fat node's `variants` (notes.variants) over `blob_len` bytes, the index of the one this host runs
 * best (this CPU, then its family, then the most features; as nxrt_tvm/epcontext/variants.py); 1 with a
 * reason when none runs here or the list is malformed. `choice` gets describe_choice's words. */
int choose_variant(const json* variants, size_t blob_len, size_t* index, char* choice, size_t choice_len,
                   char* why, size_t why_len);
/* The compatibility string of a node with these `notes` (JSON text), `ep_sdk_version` and
 * `hardware_architecture` attributes, as compat.py compatibility_info: caller frees; NULL if unreadable. */
char* compatibility_info(const char* notes_text, size_t notes_len, const char* tvm_version, const char* hardware);
/* onnxruntime's verdict on a compatibility string, as compat.py judge_compatibility; `why` says why. */
OrtCompiledModelCompatibility judge_compatibility(const char* info, char* why, size_t why_len);

/* ---- tvm_rt.c ---- */
typedef struct nx_kernel nx_kernel;
int tvm_runtime_init(char* why, size_t why_len);
/* Loads the blob; the kernel copies what it needs from `ctx`. Caller owns the result (kernel_free). */
nx_kernel* kernel_load(const nx_context* ctx, char* why, size_t why_len);
int kernel_run(nx_kernel* k, const OrtApi* api, OrtKernelContext* kc, char* why, size_t why_len);
void kernel_free(nx_kernel* k);

#endif /* NXRT_TVM_PLUGIN_H_ */
