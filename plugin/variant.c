/* Fat EPContext nodes (format 2): one library per CPU target in one blob, and the one this host runs
 * best, closest first: built for this very CPU, then for its family (znver4 on a znver5), then the one
 * using the most features (as nxrt_tvm/epcontext/variants.py). And onnxruntime's compatibility string:
 * what compat.py compatibility_info writes into the model's metadata, and judge_compatibility's verdict
 * on it for this host (OrtEpFactory::ValidateCompiledModelCompatibilityInfo). */
#include "plugin.h"

#include <ctype.h>

/* Python's re.sub(r"\d+$", "", mcpu): znver4 -> znver, x86-64-v3 -> x86-64-v. */
static void family(const char* mcpu, char* out, size_t out_len) {
  snprintf(out, out_len, "%s", mcpu);
  size_t n = strlen(out);
  while (n > 0 && isdigit((unsigned char)out[n - 1])) out[--n] = '\0';
}

/* The architecture part of "x86_64/znver4" (the whole text when it has no '/'). */
static bool arch_is_host(const char* hardware) {
  size_t n = strcspn(hardware, "/");
  return strlen(host_arch()) == n && !strncmp(hardware, host_arch(), n);
}

/* The CPU part of "x86_64/znver4" (Python's split("/", 1)[-1]). */
static const char* cpu_of(const char* hardware) {
  const char* slash = strchr(hardware, '/');
  return slash ? slash + 1 : hardware;
}

/* How close a build for `mcpu` using `features` is to this host (closeness() in variants.py), as one number:
 * this CPU, then its family, then how many distinct features that need hardware it uses. */
static long closeness(const char* mcpu, const json* features) {
  char mine[64], theirs[64];
  const char* host = host_cpu_name();
  family(host, mine, sizeof mine);
  family(mcpu, theirs, sizeof theirs);
  long used = 0;
  for (size_t i = 0; i < features->count; i++) {
    const char* f = features->items[i]->str;
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = !strcmp(features->items[j]->str, f);
    if (!seen && feature_requires_hardware(f)) used++;
  }
  return (!strcmp(mcpu, host) ? 1L << 30 : 0) + (!strcmp(mine, theirs) ? 1L << 29 : 0) + used;
}

static bool is_string_list(const json* v) {
  if (!v || v->kind != JSON_ARRAY) return false;
  for (size_t i = 0; i < v->count; i++)
    if (v->items[i]->kind != JSON_STRING) return false;
  return true;
}

static bool is_count(const json* v) {
  return v && v->kind == JSON_NUMBER && v->number >= 0 && v->number == (double)(int64_t)v->number;
}

static int cmp_names(const void* a, const void* b) { return strcmp(*(const char* const*)a, *(const char* const*)b); }

/* Appends "MCPU needs F1, F2, F3, F4" (the first four features this host lacks, sorted; else its architecture)
 * to `out`: how variants.py names a variant that cannot run here. */
static void describe_refusal(const json* v, char* out, size_t out_len) {
  const char* mcpu = json_get(v, "mcpu")->str;
  const char* hardware = json_get(v, "hardware_architecture")->str;
  const json* features = json_get(v, "cpu_features");
  size_t used = strlen(out), n = 0;
  const char** missing = malloc((features->count ? features->count : 1) * sizeof *missing);
  for (size_t i = 0; missing && i < features->count; i++) {
    const char* f = features->items[i]->str;
    if (feature_requires_hardware(f) && cpu_feature_state(f) != FEATURE_PRESENT) missing[n++] = f;
  }
  if (missing) qsort(missing, n, sizeof *missing, cmp_names);
  used += (size_t)snprintf(out + used, used < out_len ? out_len - used : 0, "%s%s needs ", *out ? "; " : "", mcpu);
  if (n == 0) {
    snprintf(out + used, used < out_len ? out_len - used : 0, "%.*s", (int)strcspn(hardware, "/"), hardware);
  }
  for (size_t i = 0; i < n && i < 4; i++)
    used += (size_t)snprintf(out + used, used < out_len ? out_len - used : 0, "%s%s", i ? ", " : "", missing[i]);
  free(missing);
}

int choose_variant(const json* variants, size_t blob_len, size_t* index, char* choice, size_t choice_len, char* why,
                   size_t why_len) {
  (void)blob_len; /* the chosen variant's bounds are checked with its size and digest, as in Python */
  for (size_t i = 0; i < variants->count; i++) {
    const json* v = variants->items[i];
    const json *mcpu = json_get(v, "mcpu"), *target = json_get(v, "target"),
               *hardware = json_get(v, "hardware_architecture"), *sha = json_get(v, "sha256");
    if (v->kind != JSON_OBJECT || !mcpu || mcpu->kind != JSON_STRING || !target || target->kind != JSON_STRING ||
        !hardware || hardware->kind != JSON_STRING || !sha || sha->kind != JSON_STRING ||
        !is_string_list(json_get(v, "cpu_features")) || !is_count(json_get(v, "offset")) ||
        !is_count(json_get(v, "size")))
      return WHY("its CPU variant %zu in notes.variants is malformed; recompile the model with `nxrt-tvm compile`", i);
  }
  const char* host = host_cpu_name();
  long best_score = -1;
  for (size_t i = 0; i < variants->count; i++) {
    const json* v = variants->items[i];
    const json* features = json_get(v, "cpu_features");
    bool fits = arch_is_host(json_get(v, "hardware_architecture")->str);
    for (size_t j = 0; fits && j < features->count; j++) fits = cpu_feature_state(features->items[j]->str) == FEATURE_PRESENT;
    long score = fits ? closeness(json_get(v, "mcpu")->str, features) : -1;
    if (score > best_score) { /* the first of equals, as Python's max */
      best_score = score;
      *index = i;
    }
  }
  if (best_score < 0) {
    char refused[640] = "";
    for (size_t i = 0; i < variants->count; i++) describe_refusal(variants->items[i], refused, sizeof refused);
    char example[96] = "";
    if (strcmp(host, "unknown")) snprintf(example, sizeof example, ",%s", host);
    return WHY("none of its %zu CPU variants runs on this host (%s/%s): %s; recompile with a --cpus list that "
               "includes this CPU or a generic level it has (e.g. `nxrt-tvm compile MODEL -o OUT --cpus x86-64-v3%s`)",
               variants->count, host_arch(), host, refused, example);
  }
  const char* mcpu = json_get(variants->items[*index], "mcpu")->str;
  char mine[64], theirs[64];
  family(host, mine, sizeof mine);
  family(mcpu, theirs, sizeof theirs);
  size_t used = (size_t)snprintf(choice, choice_len, "CPU variant %s of ", mcpu);
  for (size_t i = 0; i < variants->count; i++)
    used += (size_t)snprintf(choice + used, used < choice_len ? choice_len - used : 0, "%s%s", i ? ", " : "",
                             json_get(variants->items[i], "mcpu")->str);
  if (!strcmp(mcpu, host))
    snprintf(choice + used, used < choice_len ? choice_len - used : 0, ": built for this CPU");
  else if (!strcmp(mine, theirs))
    snprintf(choice + used, used < choice_len ? choice_len - used : 0, ": same family as this %s", host);
  else
    snprintf(choice + used, used < choice_len ? choice_len - used : 0, ": the most specific one this %s runs", host);
  return 0;
}

/* {"hardware_architecture": ..., "cpu_features": [...]} of one build; NULL when out of memory or malformed. */
static json* build_entry(const char* hardware, const json* features) {
  json* entry = json_new(JSON_OBJECT);
  json* list = json_new(JSON_ARRAY);
  bool ok = entry && list && hardware && (!features || is_string_list(features));
  for (size_t i = 0; ok && features && i < features->count; i++)
    ok = json_add(list, NULL, json_new_string(features->items[i]->str)) == 0;
  if (!ok) {
    json_free(entry);
    json_free(list);
    return NULL;
  }
  if (json_add(entry, "hardware_architecture", json_new_string(hardware)) || json_add(entry, "cpu_features", list)) {
    json_free(entry);
    return NULL;
  }
  return entry;
}

char* compatibility_info(const char* notes_text, size_t notes_len, const char* tvm_version, const char* hardware) {
  json* notes = notes_text ? json_parse(notes_text, notes_len) : NULL;
  const json *format = json_get(notes, "format_version"), *target_text = json_get(notes, "target"),
             *cpu_features = json_get(notes, "cpu_features"), *variants = json_get(notes, "variants");
  json* target = target_text && target_text->kind == JSON_STRING ? json_parse(target_text->str, target_text->len) : NULL;
  const json* kind = json_get(target, "kind");
  json* info = json_new(JSON_OBJECT);
  json* version = json_new(JSON_NUMBER);
  json* builds = json_new(JSON_ARRAY);
  char* text = NULL;
  if (!target || target->kind != JSON_OBJECT || !info || !version || !builds) goto done;
  double f = format && format->kind == JSON_NUMBER ? format->number : 0;
  version->number = f > -1e9 && f < 1e9 ? (double)(long)f : 0; /* int(notes["format_version"]) */
  if (variants && variants->kind == JSON_ARRAY && variants->count) {
    for (size_t i = 0; i < variants->count; i++) {
      const json* hw = json_get(variants->items[i], "hardware_architecture");
      if (json_add(builds, NULL, build_entry(hw && hw->kind == JSON_STRING ? hw->str : NULL,
                                             json_get(variants->items[i], "cpu_features"))))
        goto done;
    }
  } else if (json_add(builds, NULL, build_entry(hardware ? hardware : "", cpu_features))) {
    goto done;
  }
  int bad = json_add(info, "ep", json_new_string(NXRT_EP_VENDOR)); /* each json_add owns its child from here */
  bad |= json_add(info, "format_version", version);
  bad |= json_add(info, "tvm", json_new_string(tvm_version ? tvm_version : ""));
  bad |= json_add(info, "kind", json_new_string(kind && kind->kind == JSON_STRING ? kind->str : ""));
  bad |= json_add(info, "variants", builds);
  version = builds = NULL;
  if (!bad) text = json_canonical(info);
done:
  json_free(notes);
  json_free(target);
  json_free(info);
  json_free(version);
  json_free(builds);
  return text;
}

OrtCompiledModelCompatibility judge_compatibility(const char* info, char* why, size_t why_len) {
  const OrtCompiledModelCompatibility UNSUPPORTED = OrtCompiledModelCompatibility_EP_UNSUPPORTED;
  json* value = info ? json_parse(info, strlen(info)) : NULL;
  const json *variants = json_get(value, "variants"), *format = json_get(value, "format_version"),
             *tvm = json_get(value, "tvm"), *kind = json_get(value, "kind"), *ep = json_get(value, "ep");
  OrtCompiledModelCompatibility verdict = UNSUPPORTED;
  bool readable = variants && variants->kind == JSON_ARRAY && format && tvm && kind;
  for (size_t i = 0; readable && i < variants->count; i++) {
    const json* hw = json_get(variants->items[i], "hardware_architecture");
    readable = hw && hw->kind == JSON_STRING && is_string_list(json_get(variants->items[i], "cpu_features"));
  }
  if (!readable) {
    WHY("unreadable compatibility info");
    goto done;
  }
  if (!ep || ep->kind != JSON_STRING || strcmp(ep->str, NXRT_EP_VENDOR)) {
    WHY("written for another EP than %s", NXRT_EP_VENDOR);
    goto done;
  }
  if (format->kind != JSON_NUMBER || (format->number != NXRT_FORMAT_VERSION && format->number != NXRT_FAT_FORMAT_VERSION)) {
    WHY("EPContext format %g, this plugin reads %d and %d", format->kind == JSON_NUMBER ? format->number : -1.0,
        NXRT_FORMAT_VERSION, NXRT_FAT_FORMAT_VERSION);
    goto done;
  }
  if (tvm->kind != JSON_STRING || strcmp(tvm->str, NXRT_TVM_VERSION)) {
    WHY("built by TVM %s, this plugin runs TVM %s", tvm->kind == JSON_STRING ? tvm->str : "?", NXRT_TVM_VERSION);
    goto done;
  }
  if (kind->kind != JSON_STRING || strcmp(kind->str, "llvm")) {
    WHY("built for target '%s'; compatibility is judged for CPU (llvm) builds", kind->kind == JSON_STRING ? kind->str : "?");
    goto done;
  }
  long best_score = -1;
  const char* best = NULL;
  for (size_t i = 0; i < variants->count; i++) {
    const char* hw = json_get(variants->items[i], "hardware_architecture")->str;
    const json* needs = json_get(variants->items[i], "cpu_features");
    bool fits = arch_is_host(hw);
    for (size_t j = 0; fits && j < needs->count; j++)
      fits = !feature_requires_hardware(needs->items[j]->str) || cpu_feature_state(needs->items[j]->str) == FEATURE_PRESENT;
    long score = fits ? closeness(cpu_of(hw), needs) : -1;
    if (score > best_score) {
      best_score = score;
      best = hw;
    }
  }
  char own[128];
  snprintf(own, sizeof own, "%s/%s", host_arch(), host_cpu_name());
  if (!best) {
    WHY("no CPU variant runs on this %s", host_cpu_name());
  } else if (!strcmp(best, own)) {
    WHY("built for this CPU (%s)", own);
    verdict = OrtCompiledModelCompatibility_EP_SUPPORTED_OPTIMAL;
  } else {
    WHY("runs its build for %s; recompiling here would target %s", best, own);
    verdict = OrtCompiledModelCompatibility_EP_SUPPORTED_PREFER_RECOMPILATION;
  }
done:
  json_free(value);
  return verdict;
}
