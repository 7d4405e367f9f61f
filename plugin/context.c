/* An EPContext node, and the checks nxrt_tvm/epcontext/compat.py makes before
 * any native code is loaded: the model's signature, format version, TVM version,
 * blob size and sha256, target kind, (of a fat node, the CPU variant this host
 * runs best, then its own size and sha256, target kind,) CPU architecture and
 * features, ELF. External blobs must lie inside the model's folder. */
#include "plugin.h"

#include <limits.h>
#include <sys/stat.h>

static const char* const RECOMPILE = "recompile it on this host (`nxrt-tvm compile MODEL -o OUT`)";

static void drop(const OrtApi* api, OrtStatus* st) { ort_ok(api, st); }

static const OrtOpAttr* attr_of(const OrtApi* api, const OrtNode* node, const char* name) {
  const OrtOpAttr* attr = NULL;
  return ort_ok(api, api->Node_GetAttributeByName(node, name, &attr)) ? attr : NULL; /* NULL: absent */
}

/* ReadOpAttr's STRING length differs between ORT releases: some count a trailing NUL they write, some
 * write the bytes alone. Blobs are binary, so the difference matters; it is settled per node from the
 * `source` attribute, whose value is known exactly (see source_is_ours). */
typedef enum { ATTR_UNKNOWN, ATTR_PLAIN, ATTR_NUL } string_flavour;

/* The attribute's bytes, NUL-terminated (and possibly holding NULs); caller frees. NULL when absent. */
static char* string_attr(const OrtApi* api, const OrtNode* node, const char* name, string_flavour flavour,
                         size_t* len) {
  const OrtOpAttr* attr = attr_of(api, node, name);
  if (!attr) return NULL;
  size_t need = 0;
  drop(api, api->ReadOpAttr(attr, ORT_OP_ATTR_STRING, NULL, 0, &need)); /* asks for the size */
  char* buf = calloc(need + 1, 1);
  if (!buf) return NULL;
  size_t got = 0;
  if (!ort_ok(api, api->ReadOpAttr(attr, ORT_OP_ATTR_STRING, buf, need + 1, &got)) || got > need + 1) {
    free(buf);
    return NULL;
  }
  if (flavour == ATTR_NUL && got > 0) got--;
  if (len) *len = got;
  return buf;
}

/* Whether `source` is this EP's name; sets how ReadOpAttr counts string lengths on this ORT. */
static bool source_is_ours(const OrtApi* api, const OrtNode* node, string_flavour* flavour) {
  size_t n = 0, want = strlen(NXRT_EP_NAME);
  char* source = string_attr(api, node, "source", ATTR_PLAIN, &n);
  bool ours = source && !memcmp(source, NXRT_EP_NAME, want) && (n == want || (n == want + 1 && !source[want]));
  if (ours && flavour) *flavour = n == want ? ATTR_PLAIN : ATTR_NUL;
  free(source);
  return ours;
}

static int64_t int_attr(const OrtApi* api, const OrtNode* node, const char* name, int64_t fallback) {
  const OrtOpAttr* attr = attr_of(api, node, name);
  int64_t v = fallback;
  size_t n = 0;
  if (attr) {
    OrtStatus* st = api->ReadOpAttr(attr, ORT_OP_ATTR_INT, &v, sizeof v, &n);
    if (st) { api->ReleaseStatus(st); v = fallback; }
  }
  return v;
}

bool is_our_context_node(const OrtApi* api, const OrtNode* node) {
  const char *op = NULL, *domain = NULL;
  if (!ort_ok(api, api->Node_GetOperatorType(node, &op)) || !ort_ok(api, api->Node_GetDomain(node, &domain))) return false;
  if (!op || !domain || strcmp(op, "EPContext") || strcmp(domain, "com.microsoft")) return false;
  return source_is_ours(api, node, NULL);
}

static bool is_supported_elem_type(double t) {
  switch ((int)t) {
    case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 9: case 10: case 11: case 12: case 13: case 16:
      return true;
    default:
      return false;
  }
}

/* Reads the file named by an external blob path; refuses paths that leave the model's folder. */
static int read_external(const OrtApi* api, const OrtGraph* graph, const char* rel, unsigned char** out,
                         size_t* out_len, char* why, size_t why_len) {
  const ORTCHAR_T* model_path = NULL;
  OrtStatus* st = api->Graph_GetModelPath(graph, &model_path);
  if (st) { api->ReleaseStatus(st); model_path = NULL; }
  if (!model_path || !*model_path)
    return WHY("its blob is an external file (%s) but the model was given as bytes; open the model "
               "from its file path so the blob can be found beside it", rel);
  if (!*rel || rel[0] == '/' || rel[0] == '\\' || (strchr(rel, ':') && strchr(rel, ':') < (strchr(rel, '/') ? strchr(rel, '/') : rel + strlen(rel))))
    return WHY("external blob path '%s' is absolute; recompile with --external, which writes paths "
               "relative to the model", rel);
  char dir[PATH_MAX], base[PATH_MAX], joined[PATH_MAX * 2], real[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", model_path);
  char* slash = strrchr(dir, '/');
  if (slash) *slash = '\0'; else snprintf(dir, sizeof dir, ".");
  if (!realpath(dir, base)) return WHY("cannot resolve the model's folder '%s'", dir);
  snprintf(joined, sizeof joined, "%s/%s", base, rel);
  if (!realpath(joined, real)) return WHY("external blob '%s' does not exist; copy the blob files that "
                                          "`nxrt-tvm compile --external` wrote together with the model", joined);
  size_t bl = strlen(base);
  if (strncmp(real, base, bl) != 0 || (real[bl] != '/' && strcmp(base, "/") != 0))
    return WHY("external blob path '%s' leaves the model's folder '%s'; keep the blob beside the model", rel, base);
  struct stat sb;
  if (stat(real, &sb) != 0 || !S_ISREG(sb.st_mode)) return WHY("external blob '%s' is not a regular file", real);
  FILE* f = fopen(real, "rb");
  if (!f) return WHY("cannot open external blob '%s'", real);
  unsigned char* buf = malloc(sb.st_size ? (size_t)sb.st_size : 1);
  size_t got = buf ? fread(buf, 1, (size_t)sb.st_size, f) : 0;
  fclose(f);
  if (!buf || got != (size_t)sb.st_size) { free(buf); return WHY("cannot read external blob '%s'", real); }
  *out = buf;
  *out_len = got;
  return 0;
}

/* The library's bytes are the ones compiled: its size and sha256 as recorded. */
static int check_bytes(const nx_context* ctx, const json* size, const json* sha256, char* why, size_t why_len) {
  if (!size || size->kind != JSON_NUMBER || size->number != (double)ctx->blob_len)
    return WHY("blob is %zu bytes, %.0f were written (truncated or replaced); restore the artifact from the "
               "compile output, or recompile", ctx->blob_len, size && size->kind == JSON_NUMBER ? size->number : -1.0);
  char digest[65];
  sha256_hex(ctx->blob, ctx->blob_len, digest);
  if (!sha256 || sha256->kind != JSON_STRING || strcmp(sha256->str, digest))
    return WHY("blob sha256 does not match the one recorded at compile time (corrupted or swapped); restore "
               "the artifact from the compile output, or recompile");
  return 0;
}

/* It was built for the CPU (llvm). */
static int check_kind(const json* target_text, char* why, size_t why_len) {
  json* target = target_text && target_text->kind == JSON_STRING ? json_parse(target_text->str, target_text->len) : NULL;
  const json* kind = json_get(target, "kind");
  char kind_name[32] = "";
  if (kind && kind->kind == JSON_STRING) snprintf(kind_name, sizeof kind_name, "%s", kind->str);
  json_free(target);
  if (!*kind_name) return WHY("unreadable target in notes; recompile the model");
  if (strcmp(kind_name, "llvm"))
    return WHY("built for target '%s', this plugin runs 'llvm' (CPU) blobs only; run it with "
               "nxrt_tvm.InferenceSession, or %s", kind_name, RECOMPILE);
  return 0;
}

/* This host runs it: its CPU architecture and features, and a well-formed shared library of this host. */
static int check_host(const nx_context* ctx, const char* hardware, const json* cpu_features, char* why, size_t why_len) {
  char arch[64] = "";
  snprintf(arch, sizeof arch, "%s", hardware ? hardware : "");
  char* slash = strchr(arch, '/');
  if (slash) *slash = '\0';
  if (strcmp(arch, host_arch()))
    return WHY("built for %s CPUs, this host is %s; %s", *arch ? arch : "(unknown)", host_arch(), RECOMPILE);
  if (check_cpu_features(cpu_features, hardware, why, why_len)) return 1;
  char problem[256];
  nx_layout layout;
  if (blob_layout(ctx->blob, ctx->blob_len, &layout, problem, sizeof problem)) {
    layout_free(&layout);
    return WHY("blob is not a loadable shared library: its packed index is malformed: %s; restore the artifact "
               "from the compile output, or recompile",
               problem);
  }
  int bad = elf_check(ctx->blob + layout.library_offset, layout.library_len, problem, sizeof problem);
  layout_free(&layout);
  if (bad)
    return WHY("blob is not a loadable shared library: %s; restore the artifact from the compile output, or recompile",
               problem);
  return 0;
}

/* Keeps the bytes of the chosen CPU variant only (as much of them as the blob holds: their size is checked next). */
static int keep_variant(nx_context* ctx, const json* variant, const char* choice, char* why, size_t why_len) {
  double offset = json_get(variant, "offset")->number, size = json_get(variant, "size")->number;
  size_t start = offset >= (double)ctx->blob_len ? ctx->blob_len : (size_t)offset;
  size_t end = offset + size >= (double)ctx->blob_len ? ctx->blob_len : (size_t)(offset + size);
  memmove(ctx->blob, ctx->blob + start, end - start);
  ctx->blob_len = end - start;
  unsigned char* smaller = realloc(ctx->blob, ctx->blob_len ? ctx->blob_len : 1);
  if (smaller) ctx->blob = smaller;
  if (!(ctx->variant = strdup(choice))) return WHY("out of memory");
  return 0;
}

static int check_notes(const json* notes, nx_context* ctx, const char* sdk_version, const char* hardware,
                       char* why, size_t why_len) {
  const json* v = json_get(notes, "format_version");
  int format = v && v->kind == JSON_NUMBER ? (int)v->number : 0;
  const json* variants = json_get(notes, "variants");
  size_t n_variants = variants && variants->kind == JSON_ARRAY ? variants->count : 0;
  if (format != NXRT_FORMAT_VERSION && format != NXRT_FAT_FORMAT_VERSION)
    return WHY("EPContext format version %d, this plugin reads %d and %d; %s", format, NXRT_FORMAT_VERSION,
               NXRT_FAT_FORMAT_VERSION, RECOMPILE);
  if ((format == NXRT_FAT_FORMAT_VERSION) != (n_variants > 0) || (variants && variants->kind != JSON_ARRAY))
    return WHY("format version %d with %zu CPU variants listed; restore the artifact from the compile output, or "
               "recompile", format, n_variants);
  if (!sdk_version || strcmp(sdk_version, NXRT_TVM_VERSION))
    return WHY("built by TVM %s, this plugin runs TVM %s; %s", sdk_version && *sdk_version ? sdk_version : "(unknown)",
               NXRT_TVM_VERSION, RECOMPILE);
  if (check_bytes(ctx, json_get(notes, "size"), json_get(notes, "sha256"), why, why_len) ||
      check_kind(json_get(notes, "target"), why, why_len))
    return 1;
  if (!n_variants) return check_host(ctx, hardware, json_get(notes, "cpu_features"), why, why_len);
  /* a fat node whose bundle is intact: check and keep the one variant this host runs best */
  size_t index = 0;
  char choice[512];
  if (choose_variant(variants, ctx->blob_len, &index, choice, sizeof choice, why, why_len)) return 1;
  const json* chosen = variants->items[index];
  if (keep_variant(ctx, chosen, choice, why, why_len) ||
      check_bytes(ctx, json_get(chosen, "size"), json_get(chosen, "sha256"), why, why_len) ||
      check_kind(json_get(chosen, "target"), why, why_len))
    return 1;
  return check_host(ctx, json_get(chosen, "hardware_architecture")->str, json_get(chosen, "cpu_features"), why, why_len);
}

int read_context(const OrtApi* api, const OrtGraph* graph, const OrtNode* node, const nx_trust* trust,
                 nx_context* out, char* why, size_t why_len) {
  memset(out, 0, sizeof *out);
  int rc = 1;
  size_t notes_len = 0, raw_len = 0;
  string_flavour fl = ATTR_UNKNOWN;
  if (!source_is_ours(api, node, &fl)) return WHY("its source is not %s", NXRT_EP_NAME);
  char* notes_text = string_attr(api, node, "notes", fl, &notes_len);
  char* raw = string_attr(api, node, "ep_cache_context", fl, &raw_len);
  char* sdk = string_attr(api, node, "ep_sdk_version", fl, NULL);
  char* hardware = string_attr(api, node, "hardware_architecture", fl, NULL);
  char* partition = string_attr(api, node, "partition_name", fl, NULL);
  json* notes = notes_text ? json_parse(notes_text, notes_len) : NULL;
  const char* name = NULL;
  if (!partition) {
    if (ort_ok(api, api->Node_GetName(node, &name)) && name) partition = strdup(name);
  }
  out->partition = partition ? partition : strdup("(unnamed)");
  partition = NULL;

  if (int_attr(api, node, "main_context", 1) != 1) {
    WHY("main_context is 0 (a shared context); the plugin loads only nodes that own their blob");
    goto done;
  }
  if (!notes || notes->kind != JSON_OBJECT) {
    WHY("its notes attribute is missing or not JSON; recompile the model with `nxrt-tvm compile`");
    goto done;
  }
  if (!raw) {
    WHY("its ep_cache_context attribute is missing");
    goto done;
  }
  bool embedded = int_attr(api, node, "embed_mode", 1) == 1;
  if (embedded) {
    out->blob = (unsigned char*)raw;
    out->blob_len = raw_len;
    raw = NULL;
  } else if (read_external(api, graph, raw, &out->blob, &out->blob_len, why, why_len)) {
    goto done;
  }
  /* the model's signature vouches for these bytes (an external blob by its name and digest) */
  if (trust_check_blob(trust, embedded ? NULL : raw, out->blob, out->blob_len, why, why_len)) goto done;
  if (check_notes(notes, out, sdk, hardware, why, why_len)) goto done;

  /* the signature: every element type must be one the plugin can hand to TVM */
  const json* ins = json_get(notes, "inputs");
  const json* outs = json_get(notes, "outputs");
  const json* weights = json_get(notes, "weights");
  if (!ins || ins->kind != JSON_ARRAY || !outs || outs->kind != JSON_ARRAY) {
    WHY("notes carry no input/output signature; recompile the model");
    goto done;
  }
  size_t n_in = 0, n_out = 0;
  if (!ort_ok(api, api->Node_GetNumInputs(node, &n_in)) || !ort_ok(api, api->Node_GetNumOutputs(node, &n_out))) {
    WHY("cannot read the node's inputs and outputs");
    goto done;
  }
  size_t n_weights = weights && weights->kind == JSON_ARRAY ? weights->count : 0;
  if (n_in != ins->count + n_weights || n_out != outs->count) {
    WHY("node has %zu inputs and %zu outputs, its notes describe %zu and %zu", n_in, n_out,
        ins->count + n_weights, outs->count);
    goto done;
  }
  out->num_inputs = n_in;
  out->num_outputs = n_out;
  out->output_types = calloc(n_out ? n_out : 1, sizeof(int32_t));
  if (!out->output_types) { WHY("out of memory"); goto done; }
  for (size_t pass = 0; pass < 2; pass++) {
    const json* list = pass ? outs : ins;
    for (size_t i = 0; i < list->count; i++) {
      const json* sig = list->items[i];
      const json* t = sig->kind == JSON_ARRAY && sig->count == 3 ? sig->items[1] : NULL;
      if (!t || t->kind != JSON_NUMBER || !is_supported_elem_type(t->number)) {
        const char* vname = sig->kind == JSON_ARRAY && sig->count && sig->items[0]->kind == JSON_STRING ? sig->items[0]->str : "?";
        WHY("%s '%s' has ONNX element type %d, which the plugin does not pass to TVM; run it with "
            "nxrt_tvm.InferenceSession", pass ? "output" : "input", vname, t && t->kind == JSON_NUMBER ? (int)t->number : -1);
        goto done;
      }
      if (pass) out->output_types[i] = (int32_t)t->number;
    }
  }
  rc = 0;
done:
  json_free(notes);
  free(notes_text);
  free(raw);
  free(sdk);
  free(hardware);
  free(partition);
  return rc; /* `out` is the caller's either way: it names the partition in a decline */
}

void context_free(nx_context* ctx) {
  if (!ctx) return;
  free(ctx->partition);
  free(ctx->variant);
  free(ctx->blob);
  free(ctx->output_types);
  memset(ctx, 0, sizeof *ctx);
}

char* context_compatibility_info(const OrtApi* api, const OrtNode* node) {
  string_flavour fl = ATTR_UNKNOWN;
  if (!source_is_ours(api, node, &fl)) return NULL;
  size_t notes_len = 0;
  char* notes_text = string_attr(api, node, "notes", fl, &notes_len);
  char* sdk = string_attr(api, node, "ep_sdk_version", fl, NULL);
  char* hardware = string_attr(api, node, "hardware_architecture", fl, NULL);
  char* info = notes_text ? compatibility_info(notes_text, notes_len, sdk, hardware) : NULL;
  free(notes_text);
  free(sdk);
  free(hardware);
  return info;
}
