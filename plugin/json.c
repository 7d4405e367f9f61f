/* A small JSON reader for the `notes` attribute: enough for objects, arrays,
 * strings (with escapes), numbers, true/false/null. Values own their children;
 * json_free releases a whole tree once. */
#include "plugin.h"

#include <ctype.h>

typedef struct {
  const char* p;
  const char* end;
  int depth;
} reader;

static void skip_ws(reader* r) {
  while (r->p < r->end && isspace((unsigned char)*r->p)) r->p++;
}

static json* new_value(json_kind kind) {
  json* v = calloc(1, sizeof(json));
  if (v) v->kind = kind;
  return v;
}

static int append(json* parent, json* child, char* key) {
  if (parent->count == parent->cap) {
    size_t cap = parent->cap ? parent->cap * 2 : 4;
    json** items = realloc(parent->items, cap * sizeof(json*));
    if (!items) return -1;
    parent->items = items;
    if (parent->kind == JSON_OBJECT) {
      char** keys = realloc(parent->keys, cap * sizeof(char*));
      if (!keys) return -1;
      parent->keys = keys;
    }
    parent->cap = cap;
  }
  parent->items[parent->count] = child;
  if (parent->kind == JSON_OBJECT) parent->keys[parent->count] = key;
  parent->count++;
  return 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Reads a string literal at r->p (after the opening quote); returns a malloc'd UTF-8 copy. */
static char* read_string(reader* r, size_t* out_len) {
  size_t cap = 16, n = 0;
  char* s = malloc(cap);
  if (!s) return NULL;
  while (r->p < r->end && *r->p != '"') {
    unsigned long cp = (unsigned char)*r->p++;
    int escaped = cp == '\\';
    if (escaped) {
      if (r->p >= r->end) goto fail;
      char e = *r->p++;
      switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
          if (r->end - r->p < 4) goto fail;
          cp = 0;
          for (int i = 0; i < 4; i++) {
            int h = hexval(r->p[i]);
            if (h < 0) goto fail;
            cp = cp * 16 + (unsigned long)h;
          }
          r->p += 4;
          if (cp >= 0xD800 && cp < 0xDC00 && r->end - r->p >= 6 && r->p[0] == '\\' && r->p[1] == 'u') {
            unsigned long lo = 0;
            for (int i = 0; i < 4; i++) {
              int h = hexval(r->p[2 + i]);
              if (h < 0) goto fail;
              lo = lo * 16 + (unsigned long)h;
            }
            if (lo >= 0xDC00 && lo < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              r->p += 6;
            }
          }
          break;
        }
        default: goto fail;
      }
    }
    if (n + 5 > cap) {
      cap *= 2;
      char* grown = realloc(s, cap);
      if (!grown) goto fail;
      s = grown;
    }
    if (cp < 0x80 || !escaped) {  /* ASCII, or a raw UTF-8 byte copied as is */
      s[n++] = (char)cp;
    } else if (cp < 0x800) {
      s[n++] = (char)(0xC0 | (cp >> 6)); s[n++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s[n++] = (char)(0xE0 | (cp >> 12)); s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
      s[n++] = (char)(0x80 | (cp & 0x3F));
    } else {
      s[n++] = (char)(0xF0 | (cp >> 18)); s[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
      s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F)); s[n++] = (char)(0x80 | (cp & 0x3F));
    }
  }
  if (r->p >= r->end) goto fail;
  r->p++; /* closing quote */
  s[n] = '\0';
  if (out_len) *out_len = n;
  return s;
fail:
  free(s);
  return NULL;
}

static json* parse_value(reader* r) {
  skip_ws(r);
  if (r->p >= r->end || ++r->depth > 64) return NULL;
  json* v = NULL;
  char c = *r->p;
  if (c == '{' || c == '[') {
    int is_obj = c == '{';
    char close = is_obj ? '}' : ']';
    v = new_value(is_obj ? JSON_OBJECT : JSON_ARRAY);
    if (!v) return NULL;
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == close) {
      r->p++;
    } else {
      for (;;) {
        char* key = NULL;
        if (is_obj) {
          skip_ws(r);
          if (r->p >= r->end || *r->p != '"') goto fail;
          r->p++;
          if (!(key = read_string(r, NULL))) goto fail;
          skip_ws(r);
          if (r->p >= r->end || *r->p != ':') { free(key); goto fail; }
          r->p++;
        }
        json* child = parse_value(r);
        if (!child || append(v, child, key) != 0) { free(key); json_free(child); goto fail; }
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') { r->p++; continue; }
        if (r->p < r->end && *r->p == close) { r->p++; break; }
        goto fail;
      }
    }
  } else if (c == '"') {
    r->p++;
    v = new_value(JSON_STRING);
    if (!v || !(v->str = read_string(r, &v->len))) goto fail;
  } else if (r->end - r->p >= 4 && !strncmp(r->p, "true", 4)) {
    v = new_value(JSON_BOOL); if (v) v->number = 1; r->p += 4;
  } else if (r->end - r->p >= 5 && !strncmp(r->p, "false", 5)) {
    v = new_value(JSON_BOOL); r->p += 5;
  } else if (r->end - r->p >= 4 && !strncmp(r->p, "null", 4)) {
    v = new_value(JSON_NULL); r->p += 4;
  } else if (c == '-' || isdigit((unsigned char)c)) {
    char buf[64];
    size_t n = 0;
    while (r->p < r->end && n < sizeof buf - 1 && strchr("+-.eE0123456789", *r->p)) buf[n++] = *r->p++;
    buf[n] = '\0';
    char* stop;
    double d = strtod(buf, &stop);
    if (stop != buf + n) return NULL;
    v = new_value(JSON_NUMBER);
    if (v) v->number = d;
  }
  r->depth--;
  return v;
fail:
  json_free(v);
  return NULL;
}

json* json_parse(const char* text, size_t len) {
  reader r = {text, text + len, 0};
  json* v = parse_value(&r);
  skip_ws(&r);
  if (v && r.p != r.end) {
    json_free(v);
    return NULL;
  }
  return v;
}

void json_free(json* v) {
  if (!v) return;
  for (size_t i = 0; i < v->count; i++) {
    json_free(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->str);
  free(v);
}

const json* json_get(const json* obj, const char* key) {
  if (!obj || obj->kind != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->count; i++)
    if (!strcmp(obj->keys[i], key)) return obj->items[i];
  return NULL;
}

json* json_new(json_kind kind) { return new_value(kind); }

json* json_new_string(const char* s) {
  json* v = new_value(JSON_STRING);
  if (v && !(v->str = strdup(s ? s : ""))) {
    free(v);
    return NULL;
  }
  if (v) v->len = strlen(v->str);
  return v;
}

int json_add(json* parent, const char* key, json* child) {
  char* k = NULL;
  if (!parent || !child || (parent->kind == JSON_OBJECT && !(k = strdup(key ? key : ""))) ||
      append(parent, child, k) != 0) {
    free(k);
    json_free(child);
    return -1;
  }
  return 0;
}

/* ---- canonical text: what Python's json.dumps(sort_keys=True, separators=(",", ":")) writes ---- */

typedef struct {
  char* s;
  size_t n, cap;
  bool failed;
} text;

static void put(text* t, const char* s, size_t n) {
  if (t->failed) return;
  if (t->n + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->n + n + 1) cap *= 2;
    char* grown = realloc(t->s, cap);
    if (!grown) { t->failed = true; return; }
    t->s = grown;
    t->cap = cap;
  }
  memcpy(t->s + t->n, s, n);
  t->n += n;
  t->s[t->n] = '\0';
}

/* The next code point of UTF-8 text (surrogates allowed: json.c writes a lone \ud800 escape as such); -1 if malformed. */
static long utf8_next(const unsigned char** p, const unsigned char* end) {
  const unsigned char* s = *p;
  unsigned c = *s;
  int more = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
  if (more < 0 || end - s <= more) return -1;
  long cp = more == 0 ? c : more == 1 ? (c & 0x1F) : more == 2 ? (c & 0x0F) : (c & 0x07);
  for (int i = 1; i <= more; i++) {
    if ((s[i] & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  static const long least[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < least[more] || cp > 0x10FFFF) return -1; /* overlong or out of range */
  *p = s + more + 1;
  return cp;
}

/* A string as ensure_ascii writes it: \" \\ \n \r \t \b \f, any other control, DEL or non-ASCII as
 * \uXXXX (lowercase hex; a surrogate pair above U+FFFF). */
static void put_string(text* t, const char* s, size_t len) {
  const unsigned char *p = (const unsigned char*)s, *end = p + len;
  put(t, "\"", 1);
  while (p < end && !t->failed) {
    long cp = utf8_next(&p, end);
    char esc[16];
    if (cp < 0) { t->failed = true; return; }
    switch (cp) {
      case '"': put(t, "\\\"", 2); continue;
      case '\\': put(t, "\\\\", 2); continue;
      case '\n': put(t, "\\n", 2); continue;
      case '\r': put(t, "\\r", 2); continue;
      case '\t': put(t, "\\t", 2); continue;
      case '\b': put(t, "\\b", 2); continue;
      case '\f': put(t, "\\f", 2); continue;
      default: break;
    }
    if (cp >= 0x20 && cp < 0x7F) {
      char c = (char)cp;
      put(t, &c, 1);
    } else if (cp < 0x10000) {
      put(t, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04lx", cp));
    } else {
      long v = cp - 0x10000;
      put(t, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04lx\\u%04lx", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)));
    }
  }
  put(t, "\"", 1);
}

static void put_value(text* t, const json* v, int depth) {
  if (t->failed) return;
  if (depth > 64) { t->failed = true; return; }
  char num[32];
  switch (v->kind) {
    case JSON_NULL: put(t, "null", 4); return;
    case JSON_BOOL: v->number ? put(t, "true", 4) : put(t, "false", 5); return;
    case JSON_NUMBER:
      if (v->number != (double)(int64_t)v->number || v->number > 9007199254740992.0 || v->number < -9007199254740992.0) {
        t->failed = true; /* Python writes floats as repr() does: not rebuilt here */
        return;
      }
      put(t, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)v->number));
      return;
    case JSON_STRING: put_string(t, v->str, v->len); return;
    case JSON_ARRAY:
      put(t, "[", 1);
      for (size_t i = 0; i < v->count; i++) {
        if (i) put(t, ",", 1);
        put_value(t, v->items[i], depth + 1);
      }
      put(t, "]", 1);
      return;
    case JSON_OBJECT: {
      size_t* order = malloc((v->count ? v->count : 1) * sizeof *order);
      if (!order) { t->failed = true; return; }
      for (size_t i = 0; i < v->count; i++) { /* insertion sort: objects are small; UTF-8 bytes sort as code points */
        size_t j = i;
        for (; j > 0 && strcmp(v->keys[order[j - 1]], v->keys[i]) > 0; j--) order[j] = order[j - 1];
        order[j] = i;
      }
      put(t, "{", 1);
      for (size_t i = 0; i < v->count && !t->failed; i++) {
        if (i && !strcmp(v->keys[order[i]], v->keys[order[i - 1]])) t->failed = true; /* a key twice */
        if (i) put(t, ",", 1);
        put_string(t, v->keys[order[i]], strlen(v->keys[order[i]]));
        put(t, ":", 1);
        put_value(t, v->items[order[i]], depth + 1);
      }
      put(t, "}", 1);
      free(order);
      return;
    }
  }
}

char* json_canonical(const json* v) {
  text t = {0};
  if (!v) return NULL;
  put_value(&t, v, 0);
  if (t.failed || !t.s) {
    free(t.s);
    return NULL;
  }
  return t.s;
}
