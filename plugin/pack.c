/* A blob's layout, as nxrt_tvm/runtime/artifact.py writes it: the shared library alone, or packed with
 * the constants the build lifted out of it: a magic, the index's size (u64, little-endian) and the index
 * (JSON: {"library": size, "constants": [[offset, dtype, shape], ...]}), then from the next 64-byte
 * boundary (the data's start) the library and each constant, at the offsets the index gives from there.
 * The index is checked here before anything is read through it: nothing lies past the blob's end.
 */
#include "plugin.h"

#define PACKED_MAGIC "NXRTPKD\x01"
#define PACKED_MAGIC_LEN 8

static size_t aligned(size_t n) { return (n + NXRT_ALIGNMENT - 1) / NXRT_ALIGNMENT * NXRT_ALIGNMENT; }

/* nxrt_tvm/lower/lift_constants.py LIFTABLE_DTYPES, as DLPack types */
static const struct { const char* name; uint8_t code, bits; } DTYPES[] = {
    {"float16", kDLFloat, 16}, {"float32", kDLFloat, 32}, {"float64", kDLFloat, 64}, {"int8", kDLInt, 8},
    {"int16", kDLInt, 16},     {"int32", kDLInt, 32},     {"int64", kDLInt, 64},     {"uint8", kDLUInt, 8},
    {"uint16", kDLUInt, 16},   {"uint32", kDLUInt, 32},   {"uint64", kDLUInt, 64},   {"bool", kDLBool, 8}};

/* A JSON number that is a whole count (0 .. 2^53). */
static bool as_count(const json* v, size_t* out) {
  if (!v || v->kind != JSON_NUMBER || v->number < 0 || v->number > 9007199254740992.0) return false;
  if ((double)(size_t)v->number != v->number) return false;
  *out = (size_t)v->number;
  return true;
}

static bool dtype_of(const json* v, DLDataType* t) {
  if (!v || v->kind != JSON_STRING) return false;
  for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
    if (!strcmp(v->str, DTYPES[i].name)) {
      t->code = DTYPES[i].code;
      t->bits = DTYPES[i].bits;
      t->lanes = 1;
      return true;
    }
  return false;
}

/* One index entry [offset, dtype, shape] into `c`, checked against the data's `size` and the library's. */
static int read_constant(const json* e, size_t start, size_t size, size_t library, nx_constant* c, char* why,
                         size_t why_len) {
  size_t offset = 0;
  if (!e || e->kind != JSON_ARRAY || e->count != 3 || !as_count(e->items[0], &offset) ||
      !dtype_of(e->items[1], &c->dtype) || e->items[2]->kind != JSON_ARRAY || e->items[2]->count > 64)
    return WHY("a constant's entry is not [offset, dtype, shape]");
  const json* shape = e->items[2];
  c->ndim = (int32_t)shape->count;
  if (!(c->shape = calloc(shape->count ? shape->count : 1, sizeof(int64_t)))) return WHY("out of memory");
  size_t bytes = c->dtype.bits / 8;
  for (size_t d = 0; d < shape->count; d++) {
    size_t n = 0;
    if (!as_count(shape->items[d], &n)) return WHY("a constant's shape is not a list of sizes");
    if (n && bytes > SIZE_MAX / n) return WHY("a constant's size overflows");
    c->shape[d] = (int64_t)n;
    bytes *= n;
  }
  if (offset < library || offset > size || bytes > size - offset) return WHY("a constant lies outside its data");
  c->offset = start + offset;
  c->nbytes = bytes;
  return 0;
}

int blob_layout(const unsigned char* blob, size_t len, nx_layout* out, char* why, size_t why_len) {
  memset(out, 0, sizeof *out);
  if (len < PACKED_MAGIC_LEN || memcmp(blob, PACKED_MAGIC, PACKED_MAGIC_LEN)) { /* the library alone */
    out->library_len = len;
    return 0;
  }
  const size_t head = PACKED_MAGIC_LEN + sizeof(uint64_t);
  uint64_t index_len = 0;
  if (len < head) return WHY("its header is truncated");
  memcpy(&index_len, blob + PACKED_MAGIC_LEN, sizeof index_len); /* little-endian, as the hosts we build for */
  if (index_len > len - head) return WHY("its index runs past its end");
  json* index = json_parse((const char*)blob + head, (size_t)index_len);
  const json* constants = index ? json_get(index, "constants") : NULL;
  size_t start = aligned(head + (size_t)index_len), library = 0;
  int rc = 0;
  if (!index || index->kind != JSON_OBJECT || !as_count(json_get(index, "library"), &library) || !constants ||
      constants->kind != JSON_ARRAY) {
    rc = WHY("its index is unreadable");
  } else if (start > len || library == 0 || library > len - start) {
    rc = WHY("its library of %zu bytes does not fit in it", library);
  } else if (constants->count && !(out->constants = calloc(constants->count, sizeof(nx_constant)))) {
    rc = WHY("out of memory");
  } else {
    out->library_offset = start;
    out->library_len = library;
    for (size_t i = 0; i < constants->count && !rc; i++, out->num_constants++)
      rc = read_constant(constants->items[i], start, len - start, library, &out->constants[i], why, why_len);
  }
  json_free(index);
  return rc;
}

void layout_free(nx_layout* l) {
  for (size_t i = 0; i < l->num_constants; i++) free(l->constants[i].shape);
  free(l->constants);
  memset(l, 0, sizeof *l);
}
