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
