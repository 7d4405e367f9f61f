/* The TVM side: load a compiled partition (a TVM-exported shared library
 * holding a Relax VM executable) and run it over ORT's buffers.
 *
 * Ownership: a kernel owns one reference to each of its library module, VM
 * module, `main` function and lifted constant (an aligned copy out of the
 * blob), dropped once in kernel_free. Input tensors are
 * DLPack views over ORT's memory (staged into an aligned copy only when ORT's
 * buffer is not 64-byte aligned); TVM owns each view's small wrapper and frees
 * it through its deleter. Results are copied into ORT's outputs and released.
 */
#include "plugin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

struct nx_kernel {
  char* name;                /* owned */
  TVMFFIObjectHandle lib;    /* the loaded blob */
  TVMFFIObjectHandle vm;     /* vm_load_executable() */
  TVMFFIObjectHandle main;   /* vm["main"] */
  TVMFFIObjectHandle* constants; /* owned: passed after the inputs at every call (pack.c) */
  size_t num_constants;
  size_t num_inputs, num_outputs;
  int32_t* output_types;     /* owned */
  pthread_mutex_t lock;      /* a Relax VM keeps per-call state: one call at a time */
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_init_error[512];
static TVMFFIObjectHandle g_load_from_file; /* process-lifetime references to global functions */
static TVMFFIObjectHandle g_get_function;

static void* object_cell(TVMFFIObjectHandle h) { return (char*)h + sizeof(TVMFFIObject); }

static int ffi_error(const char* what, char* why, size_t why_len) {
  TVMFFIObjectHandle err = NULL;
  TVMFFIErrorMoveFromRaised(&err);
  if (!err) return WHY("%s failed", what);
  const TVMFFIErrorCell* cell = object_cell(err);
  WHY("%s failed: %.*s: %.*s", what, (int)cell->kind.size, cell->kind.data, (int)cell->message.size,
      cell->message.data);
  TVMFFIObjectDecRef(err);
  return 1;
}

static TVMFFIAny none(void) {
  TVMFFIAny a;
  memset(&a, 0, sizeof a);
  a.type_index = kTVMFFINone;
  return a;
}

static TVMFFIAny object_arg(TVMFFIObjectHandle h) {
  TVMFFIAny a = none();
  a.type_index = ((TVMFFIObject*)h)->type_index;
  a.v_obj = h;
  return a;
}

static TVMFFIAny int_arg(int64_t v) {
  TVMFFIAny a = none();
  a.type_index = kTVMFFIInt;
  a.v_int64 = v;
  return a;
}

static TVMFFIAny str_arg(const char* s) {
  TVMFFIAny a = none();
  a.type_index = kTVMFFIRawStr;
  a.v_c_str = s;
  return a;
}

static void release_any(TVMFFIAny* a) {
  if (a->type_index >= kTVMFFIStaticObjectBegin && a->v_obj) TVMFFIObjectDecRef(a->v_obj);
  *a = none();
}

static int call(TVMFFIObjectHandle f, TVMFFIAny* args, int n, TVMFFIAny* out, const char* what, char* why,
                size_t why_len) {
  *out = none();
  return TVMFFIFunctionCall(f, args, n, out) ? ffi_error(what, why, why_len) : 0;
}

static void init_once(void) {
  const char* path = getenv("NXRT_TVM_RUNTIME_LIB");
  if (!path || !*path) path = NXRT_TVM_RUNTIME_LIB;
  /* libtvm_ffi is already loaded (this library links it); compiled blobs resolve the runtime's symbols globally */
  if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL)) { /* stays loaded for the life of the process, on purpose */
    snprintf(g_init_error, sizeof g_init_error, "cannot load the TVM runtime %s: %s", path, dlerror());
    return;
  }
  TVMFFIByteArray load = {"ffi.ModuleLoadFromFile", strlen("ffi.ModuleLoadFromFile")};
  TVMFFIByteArray get = {"ffi.ModuleGetFunction", strlen("ffi.ModuleGetFunction")};
  if (TVMFFIFunctionGetGlobal(&load, &g_load_from_file) || !g_load_from_file ||
      TVMFFIFunctionGetGlobal(&get, &g_get_function) || !g_get_function) {
    snprintf(g_init_error, sizeof g_init_error, "the TVM FFI has no ffi.ModuleLoadFromFile/ffi.ModuleGetFunction");
  }
}

int tvm_runtime_init(char* why, size_t why_len) {
  pthread_once(&g_once, init_once);
  return *g_init_error ? WHY("%s", g_init_error) : 0;
}

/* module[name] as a function handle the caller owns; NULL (and `why`) when absent. */
static TVMFFIObjectHandle get_function(TVMFFIObjectHandle module, const char* name, char* why, size_t why_len) {
  TVMFFIAny args[3] = {object_arg(module), str_arg(name), int_arg(1)};
  args[2].type_index = kTVMFFIBool;
  TVMFFIAny out;
  if (call(g_get_function, args, 3, &out, name, why, why_len)) return NULL;
  if (out.type_index != kTVMFFIFunction) {
    release_any(&out);
    WHY("the compiled partition has no function '%s'", name);
    return NULL;
  }
  return out.v_obj;
}

static const char* scratch_dir(void) {
  if (access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm"; /* memory-backed: no disk write for dlopen */
  const char* tmp = getenv("TMPDIR");
  return tmp && *tmp ? tmp : "/tmp";
}

/* The library module of a blob's `layout`: written to a temp file that is unlinked once loaded. */
static TVMFFIObjectHandle load_library(const nx_context* ctx, const nx_layout* layout, char* why, size_t why_len) {
  const unsigned char* bytes = ctx->blob + layout->library_offset;
  char path[4096];
  snprintf(path, sizeof path, "%s/nxrt-tvm-ort-XXXXXX.so", scratch_dir());
  int fd = mkstemps(path, 3);
  if (fd < 0) { WHY("cannot create a temp file in %s", scratch_dir()); return NULL; }
  size_t done = 0;
  while (done < layout->library_len) {
    ssize_t n = write(fd, bytes + done, layout->library_len - done);
    if (n <= 0) break;
    done += (size_t)n;
  }
  close(fd);
  TVMFFIObjectHandle lib = NULL;
  if (done != layout->library_len) {
    WHY("cannot write the blob to %s", path);
  } else {
    TVMFFIAny arg = str_arg(path), out;
    if (!call(g_load_from_file, &arg, 1, &out, "loading the compiled partition", why, why_len)) {
      if (out.type_index >= kTVMFFIStaticObjectBegin) lib = out.v_obj;
      else { release_any(&out); WHY("loading the compiled partition returned no module"); }
    }
  }
  unlink(path);
  return lib;
}

static TVMFFIObjectHandle constant_tensor(const unsigned char* blob, const nx_constant* c, char* why, size_t why_len);

nx_kernel* kernel_load(const nx_context* ctx, char* why, size_t why_len) {
  if (tvm_runtime_init(why, why_len)) return NULL;
  nx_kernel* k = calloc(1, sizeof *k);
  if (!k) { WHY("out of memory"); return NULL; }
  pthread_mutex_init(&k->lock, NULL);
  k->name = strdup(ctx->partition ? ctx->partition : "");
  k->num_inputs = ctx->num_inputs;
  k->num_outputs = ctx->num_outputs;
  k->output_types = malloc((ctx->num_outputs ? ctx->num_outputs : 1) * sizeof(int32_t));
  if (!k->name || !k->output_types) { WHY("out of memory"); goto fail; }
  memcpy(k->output_types, ctx->output_types, ctx->num_outputs * sizeof(int32_t));
  nx_layout layout;
  if (blob_layout(ctx->blob, ctx->blob_len, &layout, why, why_len)) goto fail_layout;
  if (layout.num_constants && !(k->constants = calloc(layout.num_constants, sizeof(TVMFFIObjectHandle)))) {
    WHY("out of memory");
    goto fail_layout;
  }
  for (; k->num_constants < layout.num_constants; k->num_constants++) {
    TVMFFIObjectHandle c = constant_tensor(ctx->blob, &layout.constants[k->num_constants], why, why_len);
    if (!c) goto fail_layout;
    k->constants[k->num_constants] = c;
  }
  k->lib = load_library(ctx, &layout, why, why_len);
  layout_free(&layout);
  if (!k->lib) goto fail;

  TVMFFIObjectHandle f = get_function(k->lib, "vm_load_executable", why, why_len);
  if (!f) goto fail;
  TVMFFIAny out;
  int rc = call(f, NULL, 0, &out, "vm_load_executable", why, why_len);
  TVMFFIObjectDecRef(f);
  if (rc) goto fail;
  if (out.type_index < kTVMFFIStaticObjectBegin) { WHY("vm_load_executable returned no module"); goto fail; }
  k->vm = out.v_obj;

  if (!(f = get_function(k->vm, "vm_initialization", why, why_len))) goto fail;
  TVMFFIAny init[3] = {int_arg(kDLCPU), int_arg(0), int_arg(2 /* pooled allocator */)};
  rc = call(f, init, 3, &out, "vm_initialization", why, why_len);
  TVMFFIObjectDecRef(f);
  if (rc) goto fail;
  release_any(&out);

  if (!(k->main = get_function(k->vm, "main", why, why_len))) goto fail;
  return k;
fail_layout:
  layout_free(&layout);
fail:
  kernel_free(k);
  return NULL;
}

void kernel_free(nx_kernel* k) {
  if (!k) return;
  if (k->main) TVMFFIObjectDecRef(k->main);
  if (k->vm) TVMFFIObjectDecRef(k->vm);
  if (k->lib) TVMFFIObjectDecRef(k->lib);
  for (size_t i = 0; i < k->num_constants; i++) TVMFFIObjectDecRef(k->constants[i]);
  free(k->constants);
  pthread_mutex_destroy(&k->lock);
  free(k->output_types);
  free(k->name);
  free(k);
}

/* ---- tensors ---- */

static bool dl_type_of(int32_t onnx, DLDataType* t) {
  static const struct { int32_t onnx; uint8_t code, bits; } map[] = {
      {1, kDLFloat, 32}, {2, kDLUInt, 8}, {3, kDLInt, 8}, {4, kDLUInt, 16}, {5, kDLInt, 16}, {6, kDLInt, 32},
      {7, kDLInt, 64}, {9, kDLBool, 8}, {10, kDLFloat, 16}, {11, kDLFloat, 64}, {12, kDLUInt, 32},
      {13, kDLUInt, 64}, {16, kDLBfloat, 16}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (map[i].onnx == onnx) {
      t->code = map[i].code;
      t->bits = map[i].bits;
      t->lanes = 1;
      return true;
    }
  return false;
}

static size_t elem_bytes(DLDataType t) { return ((size_t)t.bits * t.lanes + 7) / 8; }

typedef struct {
  DLManagedTensor managed; /* first: TVM hands this pointer back to the deleter */
  void* staged;            /* aligned copy, when ORT's buffer was not aligned */
  int64_t shape[];
} input_view;

static void input_view_deleter(DLManagedTensor* m) {
  input_view* v = (input_view*)m;
  free(v->staged);
  free(v);
}

/* A TVM tensor over an ORT input; the caller owns the returned reference. */
static TVMFFIObjectHandle wrap_input(const OrtApi* api, const OrtValue* value, char* why, size_t why_len) {
  ONNXTensorElementDataType et;
  const int64_t* shape = NULL;
  size_t ndim = 0;
  const void* data = NULL;
  DLDataType dt;
  if (!ort_ok(api, api->GetTensorElementTypeAndShapeDataReference(value, &et, &shape, &ndim)) ||
      !ort_ok(api, api->GetTensorData(value, &data))) {
    WHY("cannot read an input tensor");
    return NULL;
  }
  if (!dl_type_of((int32_t)et, &dt)) { WHY("input element type %d is not supported", (int)et); return NULL; }
  input_view* v = calloc(1, sizeof(input_view) + (ndim ? ndim : 1) * sizeof(int64_t));
  if (!v) { WHY("out of memory"); return NULL; }
  size_t count = 1;
  for (size_t i = 0; i < ndim; i++) {
    v->shape[i] = shape[i];
    count *= (size_t)shape[i];
  }
  size_t bytes = count * elem_bytes(dt);
  void* ptr = (void*)data;
  if (bytes == 0 || ((uintptr_t)data % NXRT_ALIGNMENT) != 0) {
    size_t cap = (bytes + NXRT_ALIGNMENT - 1) / NXRT_ALIGNMENT * NXRT_ALIGNMENT;
    v->staged = aligned_alloc(NXRT_ALIGNMENT, cap ? cap : NXRT_ALIGNMENT);
    if (!v->staged) { free(v); WHY("out of memory"); return NULL; }
    if (bytes) memcpy(v->staged, data, bytes);
    ptr = v->staged;
  }
  v->managed.dl_tensor.data = ptr;
  v->managed.dl_tensor.device.device_type = kDLCPU;
  v->managed.dl_tensor.device.device_id = 0;
  v->managed.dl_tensor.ndim = (int32_t)ndim;
  v->managed.dl_tensor.dtype = dt;
  v->managed.dl_tensor.shape = v->shape;
  v->managed.dl_tensor.strides = NULL;
  v->managed.dl_tensor.byte_offset = 0;
  v->managed.deleter = input_view_deleter;
  TVMFFIObjectHandle h = NULL;
  if (TVMFFITensorFromDLPack(&v->managed, 0, 0, &h)) {
    input_view_deleter(&v->managed); /* not taken: it failed before owning the view */
    ffi_error("wrapping an input", why, why_len);
    return NULL;
  }
  return h;
}

/* A lifted constant as a TVM tensor over an aligned copy of its bytes in the blob; the caller owns it. */
static TVMFFIObjectHandle constant_tensor(const unsigned char* blob, const nx_constant* c, char* why, size_t why_len) {
  input_view* v = calloc(1, sizeof(input_view) + (c->ndim ? (size_t)c->ndim : 1) * sizeof(int64_t));
  size_t cap = (c->nbytes + NXRT_ALIGNMENT - 1) / NXRT_ALIGNMENT * NXRT_ALIGNMENT;
  if (!v || !(v->staged = aligned_alloc(NXRT_ALIGNMENT, cap ? cap : NXRT_ALIGNMENT))) {
    free(v);
    WHY("out of memory");
    return NULL;
  }
  memcpy(v->staged, blob + c->offset, c->nbytes);
  memcpy(v->shape, c->shape, (size_t)c->ndim * sizeof(int64_t));
  v->managed.dl_tensor.data = v->staged;
  v->managed.dl_tensor.device.device_type = kDLCPU;
  v->managed.dl_tensor.ndim = c->ndim;
  v->managed.dl_tensor.dtype = c->dtype;
  v->managed.dl_tensor.shape = v->shape;
  v->managed.deleter = input_view_deleter;
  TVMFFIObjectHandle h = NULL;
  if (TVMFFITensorFromDLPack(&v->managed, 0, 0, &h)) {
    input_view_deleter(&v->managed);
    ffi_error("wrapping a constant", why, why_len);
    return NULL;
  }
  return h;
}

typedef struct {
  bool is_float;
  int64_t i;
  double f;
} number;

static bool read_number(const char* p, DLDataType t, number* n) {
  n->is_float = t.code == kDLFloat;
  switch (t.code * 1000 + t.bits) {
    case kDLInt * 1000 + 8: n->i = *(const int8_t*)p; return true;
    case kDLInt * 1000 + 16: n->i = *(const int16_t*)p; return true;
    case kDLInt * 1000 + 32: n->i = *(const int32_t*)p; return true;
    case kDLInt * 1000 + 64: n->i = *(const int64_t*)p; return true;
    case kDLUInt * 1000 + 1: case kDLUInt * 1000 + 8: case kDLBool * 1000 + 8: n->i = *(const uint8_t*)p; return true;
    case kDLUInt * 1000 + 16: n->i = *(const uint16_t*)p; return true;
    case kDLUInt * 1000 + 32: n->i = *(const uint32_t*)p; return true;
    case kDLUInt * 1000 + 64: n->i = (int64_t) * (const uint64_t*)p; return true;
    case kDLFloat * 1000 + 32: n->f = *(const float*)p; return true;
    case kDLFloat * 1000 + 64: n->f = *(const double*)p; return true;
    default: return false;
  }
}

static bool write_number(char* p, DLDataType t, number n) {
  double f = n.is_float ? n.f : (double)n.i;
  int64_t i = n.is_float ? (int64_t)n.f : n.i;
  switch (t.code * 1000 + t.bits) {
    case kDLInt * 1000 + 8: *(int8_t*)p = (int8_t)i; return true;
    case kDLInt * 1000 + 16: *(int16_t*)p = (int16_t)i; return true;
    case kDLInt * 1000 + 32: *(int32_t*)p = (int32_t)i; return true;
    case kDLInt * 1000 + 64: *(int64_t*)p = i; return true;
    case kDLBool * 1000 + 8: *(uint8_t*)p = n.is_float ? n.f != 0 : n.i != 0; return true;
    case kDLUInt * 1000 + 8: *(uint8_t*)p = (uint8_t)i; return true;
    case kDLUInt * 1000 + 16: *(uint16_t*)p = (uint16_t)i; return true;
    case kDLUInt * 1000 + 32: *(uint32_t*)p = (uint32_t)i; return true;
    case kDLUInt * 1000 + 64: *(uint64_t*)p = (uint64_t)i; return true;
    case kDLFloat * 1000 + 32: *(float*)p = (float)f; return true;
    case kDLFloat * 1000 + 64: *(double*)p = f; return true;
    default: return false;
  }
}

static bool same_type(DLDataType a, DLDataType b) {
  bool a_bool = a.code == kDLBool || (a.code == kDLUInt && a.bits == 1);
  bool b_bool = b.code == kDLBool || (b.code == kDLUInt && b.bits == 1);
  if (a_bool || b_bool) return a_bool && b_bool;
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/* Writes `count` elements of type `src_t` into ORT output `index`, shaped `shape`, as ONNX type `onnx`. */
static int write_output(const OrtApi* api, OrtKernelContext* kc, size_t index, const int64_t* shape, size_t ndim,
                        const void* src, DLDataType src_t, int32_t onnx, char* why, size_t why_len) {
  DLDataType want;
  if (!dl_type_of(onnx, &want)) return WHY("output %zu has unsupported ONNX type %d", index, (int)onnx);
  size_t count = 1;
  for (size_t i = 0; i < ndim; i++) count *= (size_t)shape[i];
  OrtValue* out = NULL;
  void* dst = NULL;
  if (!ort_ok(api, api->KernelContext_GetOutput(kc, index, shape, ndim, &out)) || !out ||
      (count && !ort_ok(api, api->GetTensorMutableData(out, &dst))))
    return WHY("cannot allocate output %zu", index);
  if (count == 0) return 0;
  if (same_type(src_t, want) && elem_bytes(src_t) == elem_bytes(want)) {
    memcpy(dst, src, count * elem_bytes(want));
    return 0;
  }
  size_t sb = elem_bytes(src_t), db = elem_bytes(want);
  for (size_t i = 0; i < count; i++) {
    number n = {0};
    if (!read_number((const char*)src + i * sb, src_t, &n) || !write_number((char*)dst + i * db, want, n))
      return WHY("output %zu: cannot convert TVM's type (code %d, %d bits) to ONNX type %d", index, src_t.code,
                 src_t.bits, (int)onnx);
  }
  return 0;
}

/* One VM result (a tensor, a shape, or a scalar) into ORT output `index`. */
static int emit(const OrtApi* api, OrtKernelContext* kc, size_t index, const TVMFFIAny* v, int32_t onnx,
                char* why, size_t why_len) {
  DLDataType i64 = {kDLInt, 64, 1}, f64 = {kDLFloat, 64, 1};
  switch (v->type_index) {
    case kTVMFFITensor: {
      const DLTensor* t = object_cell(v->v_obj);
      if (t->device.device_type != kDLCPU) return WHY("output %zu is not in host memory", index);
      if (t->strides) { /* the VM returns compact tensors; refuse anything else rather than misread it */
        int64_t expect = 1;
        for (int d = t->ndim - 1; d >= 0; d--) {
          if (t->shape[d] != 1 && t->strides[d] != expect) return WHY("output %zu is not contiguous", index);
          expect *= t->shape[d];
        }
      }
      return write_output(api, kc, index, t->shape, (size_t)t->ndim, (const char*)t->data + t->byte_offset, t->dtype,
                          onnx, why, why_len);
    }
    case kTVMFFIShape: {
      const TVMFFIShapeCell* s = object_cell(v->v_obj);
      int64_t dims[1] = {(int64_t)s->size};
      return write_output(api, kc, index, dims, 1, s->data, i64, onnx, why, why_len);
    }
    case kTVMFFIInt:
    case kTVMFFIBool:
      return write_output(api, kc, index, NULL, 0, &v->v_int64, i64, onnx, why, why_len);
    case kTVMFFIFloat:
      return write_output(api, kc, index, NULL, 0, &v->v_float64, f64, onnx, why, why_len);
    default:
      return WHY("output %zu: the VM returned a value of FFI type %d, not a tensor", index, (int)v->type_index);
  }
}

int kernel_run(nx_kernel* k, const OrtApi* api, OrtKernelContext* kc, char* why, size_t why_len) {
  size_t n_in = 0, n_out = 0;
  if (!ort_ok(api, api->KernelContext_GetInputCount(kc, &n_in)) ||
      !ort_ok(api, api->KernelContext_GetOutputCount(kc, &n_out)))
    return WHY("cannot read the kernel context");
  if (n_in != k->num_inputs || n_out != k->num_outputs)
    return WHY("partition %s takes %zu inputs and %zu outputs, ORT gave %zu and %zu", k->name, k->num_inputs,
               k->num_outputs, n_in, n_out);
  TVMFFIAny* args = calloc(n_in + k->num_constants + 1, sizeof(TVMFFIAny));
  if (!args) return WHY("out of memory");
  int rc = 0;
  size_t wrapped = 0;
  for (; wrapped < n_in; wrapped++) {
    const OrtValue* value = NULL;
    if (!ort_ok(api, api->KernelContext_GetInput(kc, wrapped, &value)) || !value) {
      rc = WHY("input %zu of partition %s is missing", wrapped, k->name);
      break;
    }
    TVMFFIObjectHandle h = wrap_input(api, value, why, why_len);
    if (!h) { rc = 1; break; }
    args[wrapped] = object_arg(h);
  }
  TVMFFIAny result = none();
  if (!rc) {
    for (size_t i = 0; i < k->num_constants; i++) args[n_in + i] = object_arg(k->constants[i]); /* borrowed */
    pthread_mutex_lock(&k->lock);
    rc = call(k->main, args, (int)(n_in + k->num_constants), &result, k->name, why, why_len);
    pthread_mutex_unlock(&k->lock);
  }
  for (size_t i = 0; i < wrapped; i++) release_any(&args[i]);
  free(args);
  if (rc) return rc;

  if (n_out == 1) {
    rc = emit(api, kc, 0, &result, k->output_types[0], why, why_len);
  } else if (result.type_index == kTVMFFIArray) {
    const TVMFFISeqCell* seq = object_cell(result.v_obj);
    if ((size_t)seq->size != n_out) {
      rc = WHY("partition %s returned %lld outputs, expected %zu", k->name, (long long)seq->size, n_out);
    } else {
      const TVMFFIAny* items = seq->data;
      for (size_t i = 0; i < n_out && !rc; i++) rc = emit(api, kc, i, &items[i], k->output_types[i], why, why_len);
    }
  } else {
    rc = WHY("partition %s returned one value, expected %zu outputs", k->name, n_out);
  }
  release_any(&result);
  return rc;
}
