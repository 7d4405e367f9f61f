/* The ORT plugin-EP ABI (onnxruntime_ep_c_api.h): one factory for the CPU, an
 * EP that claims the EPContext nodes nxrt-tvm wrote, compiles each into a TVM
 * kernel and runs it.
 *
 * Ownership: ORT owns the factory from CreateEpFactories until it calls
 * ReleaseEpFactory, each EP from CreateEp until ReleaseEp, each compute info
 * from Compile until ReleaseNodeComputeInfos; each of those frees what the
 * plugin allocated, once. Graph, node and attribute pointers are ORT's and are
 * not kept past the call that received them.
 */
#include "plugin.h"

#include <stdarg.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  OrtEpFactory base; /* first: ORT hands this pointer back */
  const OrtApi* api;
  const OrtEpApi* ep_api;
  const OrtLogger* logger; /* ORT's default logger; valid while the factory lives */
} nx_factory;

typedef struct {
  OrtEp base; /* first */
  const OrtApi* api;
  const OrtEpApi* ep_api;
  const OrtLogger* logger; /* the session's; valid while the EP lives */
  nx_policy* policy;       /* owned; the session's trusted keys and signature requirement */
  nx_trust* trust;         /* owned; the model's signature, checked when the first of our nodes is seen */
  bool trust_checked;
  char* compat_info;       /* owned; what GetCompiledModelCompatibilityInfo returned last */
} nx_ep;

typedef struct {
  OrtNodeComputeInfo base; /* first */
  const OrtApi* api;
  nx_kernel* kernel; /* owned */
} nx_compute;

static OrtStatus* fail(const OrtApi* api, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return api->CreateStatus(ORT_EP_FAIL, msg);
}

static void log_msg(const nx_ep* ep, OrtLoggingLevel level, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ep->logger) ort_ok(ep->api, ep->api->Logger_LogMessage(ep->logger, level, msg, __FILE__, __LINE__, __func__));
}

/* ---- OrtNodeComputeInfo ---- */

static OrtStatus* ORT_API_CALL create_state(OrtNodeComputeInfo* self, OrtNodeComputeContext* ctx, void** state) {
  (void)ctx;
  *state = self; /* the kernel is the state; nothing to allocate per session */
  return NULL;
}

static OrtStatus* ORT_API_CALL compute(OrtNodeComputeInfo* self, void* state, OrtKernelContext* kc) {
  (void)state;
  nx_compute* c = (nx_compute*)self;
  char why[1024];
  return kernel_run(c->kernel, c->api, kc, why, sizeof why) ? c->api->CreateStatus(ORT_EP_FAIL, why) : NULL;
}

static void ORT_API_CALL release_state(OrtNodeComputeInfo* self, void* state) { (void)self; (void)state; }

/* ---- OrtEp ---- */

static const char* ORT_API_CALL ep_name(const OrtEp* self) { (void)self; return NXRT_EP_NAME; }

static OrtStatus* graph_nodes(const OrtApi* api, const OrtGraph* graph, const OrtNode*** nodes, size_t* n) {
  *nodes = NULL;
  OrtStatus* st = api->Graph_GetNumNodes(graph, n);
  if (st || *n == 0) return st;
  *nodes = malloc(*n * sizeof(OrtNode*));
  if (!*nodes) return fail(api, "out of memory");
  st = api->Graph_GetNodes(graph, *nodes, *n);
  if (st) { free(*nodes); *nodes = NULL; }
  return st;
}

/* The model's signature, checked once per session (each EP serves one session, one model). NULL only when
 * out of memory, which read_context then declines. */
static const nx_trust* model_trust(nx_ep* ep, const OrtGraph* graph) {
  if (!ep->trust_checked) {
    const ORTCHAR_T* path = NULL;
    if (!ort_ok(ep->api, ep->api->Graph_GetModelPath(graph, &path))) path = NULL;
    ep->trust = trust_model(ep->policy, path);
    ep->trust_checked = true;
  }
  return ep->trust;
}

static OrtStatus* ORT_API_CALL get_capability(OrtEp* self, const OrtGraph* graph, OrtEpGraphSupportInfo* info) {
  nx_ep* ep = (nx_ep*)self;
  const OrtNode** nodes = NULL;
  size_t n = 0;
  OrtStatus* st = graph_nodes(ep->api, graph, &nodes, &n);
  for (size_t i = 0; i < n && !st; i++) {
    if (!is_our_context_node(ep->api, nodes[i])) continue;
    nx_context ctx;
    char why[1024];
    if (read_context(ep->api, graph, nodes[i], model_trust(ep, graph), &ctx, why, sizeof why) == 0) {
      OrtNodeFusionOptions options = {ORT_API_VERSION, false};
      st = ep->ep_api->EpGraphSupportInfo_AddNodesToFuse(info, &nodes[i], 1, &options);
    } else {
      const char* node_name = "";
      ort_ok(ep->api, ep->api->Node_GetName(nodes[i], &node_name));
      log_msg(ep, ORT_LOGGING_LEVEL_WARNING, "%s declines EPContext node '%s' (partition %s): %s", NXRT_EP_NAME,
              node_name ? node_name : "", ctx.partition ? ctx.partition : "?", why);
    }
    context_free(&ctx);
  }
  free(nodes);
  return st;
}

static OrtStatus* ORT_API_CALL compile(OrtEp* self, const OrtGraph** graphs, const OrtNode** fused_nodes,
                                       size_t count, OrtNodeComputeInfo** infos, OrtNode** ep_context_nodes) {
  (void)fused_nodes;
  (void)ep_context_nodes; /* the nodes are EPContext nodes already: nothing to write back */
  nx_ep* ep = (nx_ep*)self;
  for (size_t i = 0; i < count; i++) infos[i] = NULL;
  for (size_t i = 0; i < count; i++) {
    const OrtNode** nodes = NULL;
    size_t n = 0;
    OrtStatus* st = graph_nodes(ep->api, graphs[i], &nodes, &n);
    if (st) return st;
    const OrtNode* node = n == 1 ? nodes[0] : NULL;
    free(nodes);
    if (!node || !is_our_context_node(ep->api, node))
      return fail(ep->api, "%s: expected one EPContext node per fused graph, got %zu nodes", NXRT_EP_NAME, n);
    nx_context ctx;
    char why[1024];
    nx_kernel* kernel = NULL;
    if (read_context(ep->api, graphs[i], node, model_trust(ep, graphs[i]), &ctx, why, sizeof why) == 0)
      kernel = kernel_load(&ctx, why, sizeof why); /* checked again: what loads is what passed */
    char partition[256], variant[512];
    snprintf(partition, sizeof partition, "%s", ctx.partition ? ctx.partition : "?");
    snprintf(variant, sizeof variant, "%s", ctx.variant ? ctx.variant : "");
    context_free(&ctx);
    if (!kernel) return fail(ep->api, "%s: cannot load partition %s: %s", NXRT_EP_NAME, partition, why);
    nx_compute* c = calloc(1, sizeof *c);
    if (!c) {
      kernel_free(kernel);
      return fail(ep->api, "out of memory");
    }
    c->base.ort_version_supported = ORT_API_VERSION;
    c->base.CreateState = create_state;
    c->base.Compute = compute;
    c->base.ReleaseState = release_state;
    c->api = ep->api;
    c->kernel = kernel;
    infos[i] = &c->base; /* ORT owns it now, even if a later partition fails */
    if (*variant) /* as the Python session logs its choice (variants.py describe_choice) */
      log_msg(ep, ORT_LOGGING_LEVEL_INFO, "%s loaded partition %s: %s", NXRT_EP_NAME, partition, variant);
    else
      log_msg(ep, ORT_LOGGING_LEVEL_VERBOSE, "%s loaded partition %s", NXRT_EP_NAME, partition);
  }
  return NULL;
}

static void ORT_API_CALL release_compute_infos(OrtEp* self, OrtNodeComputeInfo** infos, size_t n) {
  (void)self;
  for (size_t i = 0; i < n; i++) {
    nx_compute* c = (nx_compute*)infos[i];
    if (!c) continue;
    kernel_free(c->kernel);
    free(c);
  }
}

/* The compatibility string of a graph of our EPContext nodes (the first one's: the partitions of one compile
 * share format, TVM and CPU targets), as compat.py compatibility_info writes it into the model's metadata.
 * ORT copies the string; the EP keeps it until the next call or its release. "" (no information, which ORT
 * skips) where the graph holds none of our nodes: the header promises ORT a string, not NULL. */
static const char* ORT_API_CALL get_compat_info(OrtEp* self, const OrtGraph* graph) {
  nx_ep* ep = (nx_ep*)self;
  const OrtNode** nodes = NULL;
  size_t n = 0;
  char* info = NULL;
  if (ort_ok(ep->api, graph_nodes(ep->api, graph, &nodes, &n)))
    for (size_t i = 0; i < n && !info; i++)
      if (is_our_context_node(ep->api, nodes[i])) info = context_compatibility_info(ep->api, nodes[i]);
  free(nodes);
  free(ep->compat_info);
  ep->compat_info = info;
  return info ? info : "";
}

/* ---- OrtEpFactory ---- */

static const char* ORT_API_CALL factory_name(const OrtEpFactory* self) { (void)self; return NXRT_EP_NAME; }
static const char* ORT_API_CALL factory_vendor(const OrtEpFactory* self) { (void)self; return NXRT_EP_VENDOR; }
static uint32_t ORT_API_CALL factory_vendor_id(const OrtEpFactory* self) { (void)self; return 0; }
static const char* ORT_API_CALL factory_version(const OrtEpFactory* self) { (void)self; return NXRT_EP_VERSION; }

/* onnxruntime's question (GetModelCompatibilityForEpDevices): may a model compiled with this
 * compatibility string run here, and is it built for this very CPU? Judged as compat.py
 * judge_compatibility; every device is this host's CPU. */
static OrtStatus* ORT_API_CALL validate_compat(OrtEpFactory* self, const OrtHardwareDevice* const* devices, size_t n,
                                               const char* info, OrtCompiledModelCompatibility* out) {
  (void)devices; (void)n;
  nx_factory* f = (nx_factory*)self;
  char why[512] = "";
  *out = judge_compatibility(info, why, sizeof why);
  if (f->logger) {
    char msg[640];
    snprintf(msg, sizeof msg, "%s: compiled model compatibility %d: %s", NXRT_EP_NAME, (int)*out, why);
    ort_ok(f->api, f->api->Logger_LogMessage(f->logger, ORT_LOGGING_LEVEL_INFO, msg, __FILE__, __LINE__, __func__));
  }
  return NULL;
}

/* What ORT may call on any factory: the plugin has no allocator, data transfer or stream of its own
 * (it works in ORT's CPU memory). */
static OrtStatus* ORT_API_CALL create_allocator(OrtEpFactory* self, const OrtMemoryInfo* info,
                                                const OrtKeyValuePairs* options, OrtAllocator** out) {
  (void)self; (void)info; (void)options;
  *out = NULL; /* ORT's default CPU allocator */
  return NULL;
}
static void ORT_API_CALL release_allocator(OrtEpFactory* self, OrtAllocator* allocator) { (void)self; (void)allocator; }
static OrtStatus* ORT_API_CALL create_data_transfer(OrtEpFactory* self, OrtDataTransferImpl** out) {
  (void)self;
  *out = NULL;
  return NULL;
}
static bool ORT_API_CALL is_stream_aware(const OrtEpFactory* self) { (void)self; return false; }
static OrtStatus* ORT_API_CALL create_stream(OrtEpFactory* self, const OrtMemoryDevice* device,
                                             const OrtKeyValuePairs* options, OrtSyncStreamImpl** out) {
  (void)self; (void)device; (void)options;
  *out = NULL;
  return NULL;
}
static OrtStatus* ORT_API_CALL incompatibility_details(OrtEpFactory* self, const OrtHardwareDevice* hw,
                                                       OrtDeviceEpIncompatibilityDetails* details) {
  (void)self; (void)hw; (void)details;
  return NULL; /* no details: every CPU is a candidate; blobs are checked per node */
}

static OrtStatus* ORT_API_CALL supported_devices(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                                 size_t num_devices, OrtEpDevice** ep_devices, size_t max_ep_devices,
                                                 size_t* num_ep_devices) {
  nx_factory* f = (nx_factory*)self;
  *num_ep_devices = 0;
  for (size_t i = 0; i < num_devices && *num_ep_devices < max_ep_devices; i++) {
    if (f->api->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
    OrtStatus* st = f->ep_api->CreateEpDevice(self, devices[i], NULL, NULL, &ep_devices[*num_ep_devices]);
    if (st) return st;
    ++*num_ep_devices; /* ORT owns the OrtEpDevice */
    break;             /* one CPU device is all TVM's host runtime uses */
  }
  return NULL;
}

static OrtStatus* ORT_API_CALL create_ep(OrtEpFactory* self, const OrtHardwareDevice* const* devices,
                                         const OrtKeyValuePairs* const* metadata, size_t num_devices,
                                         const OrtSessionOptions* options, const OrtLogger* logger, OrtEp** out) {
  (void)devices; (void)metadata; (void)num_devices;
  nx_factory* f = (nx_factory*)self;
  *out = NULL;
  char why[1024];
  if (tvm_runtime_init(why, sizeof why)) return fail(f->api, "%s: %s", NXRT_EP_NAME, why);
  nx_policy* policy = NULL; /* a bad key or flag fails the session, as in nxrt_tvm.InferenceSession */
  if (policy_load(f->api, options, &policy, why, sizeof why)) return fail(f->api, "%s: %s", NXRT_EP_NAME, why);
  nx_ep* ep = calloc(1, sizeof *ep);
  if (!ep) {
    policy_free(policy);
    return fail(f->api, "out of memory");
  }
  ep->base.ort_version_supported = ORT_API_VERSION;
  ep->base.GetName = ep_name;
  ep->base.GetCapability = get_capability;
  ep->base.Compile = compile;
  ep->base.ReleaseNodeComputeInfos = release_compute_infos;
  ep->base.GetCompiledModelCompatibilityInfo = get_compat_info;
  ep->api = f->api;
  ep->ep_api = f->ep_api;
  ep->logger = logger;
  ep->policy = policy;
  *out = &ep->base;
  return NULL;
}

static void ORT_API_CALL release_ep(OrtEpFactory* self, OrtEp* base) {
  (void)self;
  nx_ep* ep = (nx_ep*)base;
  if (!ep) return;
  policy_free(ep->policy);
  trust_free(ep->trust);
  free(ep->compat_info);
  free(ep);
}

EXPORT OrtStatus* CreateEpFactories(const char* registered_name, const OrtApiBase* ort_api_base,
                                    const OrtLogger* default_logger, OrtEpFactory** factories, size_t max_factories,
                                    size_t* num_factories) {
  (void)registered_name;
  *num_factories = 0;
  const OrtApi* api = ort_api_base->GetApi(ORT_API_VERSION);
  if (!api) return NULL; /* an ORT older than these headers: it offers no API to report through */
  if (max_factories < 1) return api->CreateStatus(ORT_INVALID_ARGUMENT, "no room for a factory");
  nx_factory* f = calloc(1, sizeof *f);
  if (!f) return api->CreateStatus(ORT_FAIL, "out of memory");
  f->api = api;
  f->ep_api = api->GetEpApi();
  f->logger = default_logger;
  f->base.ort_version_supported = ORT_API_VERSION;
  f->base.GetName = factory_name;
  f->base.GetVendor = factory_vendor;
  f->base.GetSupportedDevices = supported_devices;
  f->base.CreateEp = create_ep;
  f->base.ReleaseEp = release_ep;
  f->base.GetVendorId = factory_vendor_id;
  f->base.GetVersion = factory_version;
  f->base.ValidateCompiledModelCompatibilityInfo = validate_compat;
  f->base.CreateAllocator = create_allocator;
  f->base.ReleaseAllocator = release_allocator;
  f->base.CreateDataTransfer = create_data_transfer;
  f->base.IsStreamAware = is_stream_aware;
  f->base.CreateSyncStreamForDevice = create_stream;
  f->base.GetHardwareDeviceIncompatibilityDetails = incompatibility_details;
  factories[0] = &f->base;
  *num_factories = 1;
  return NULL;
}

/* For tests and tools (not part of ORT's ABI): the string GetCompiledModelCompatibilityInfo returns for one of
 * our EPContext nodes with these attributes, written into `out` (NUL-terminated) when it fits. Returns its length
 * (excluding the NUL), or -1 when the notes are unreadable. */
EXPORT long NxrtTvmCompatibilityInfo(const char* notes, const char* ep_sdk_version, const char* hardware_architecture,
                                     char* out, size_t out_len) {
  char* info = notes ? compatibility_info(notes, strlen(notes), ep_sdk_version, hardware_architecture) : NULL;
  long n = info ? (long)strlen(info) : -1;
  if (info && out && (size_t)n < out_len) memcpy(out, info, (size_t)n + 1);
  free(info);
  return n;
}

EXPORT OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  free((nx_factory*)factory);
  return NULL;
}
