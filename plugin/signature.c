/* Signed models (as nxrt_tvm/epcontext/signing.py): the sidecar MODEL.sig holds a manifest (the model's
 * name and sha256, each external blob's relative name and sha256), the algorithm (ECDSA P-256 with
 * SHA-256, or Ed25519), the signing key's fingerprint (sha256 of its DER SubjectPublicKeyInfo) and the
 * signature over the manifest's canonical JSON. The session's config names the trusted keys
 * (nxrt.trusted_keys) and whether a signature is required (nxrt.require_signature).
 *
 * A present signature is always checked: with a trusted key where any are given, and its digests in every
 * case, so a signed model edited after signing never loads. Verification uses OpenSSL's libcrypto; a plugin
 * built without it (no headers at build time) loads no code of a signed model, nor of any model when a
 * signature is required. */
#include "plugin.h"

#include <ctype.h>
#include <limits.h>
#include <sys/stat.h>

#ifdef NXRT_HAVE_OPENSSL
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
#include <openssl/core_names.h>
#else
#include <openssl/ec.h>
#endif
#endif

#define MAYBE_UNUSED __attribute__((unused)) /* what a build without OpenSSL does not call */
#define SIGNATURE_FORMAT "nxrt-tvm-signature/1"
#define ECDSA_P256 "ecdsa-p256-sha256"
#define ED25519 "ed25519"

static const char* const SIGN =
    "sign it with `nxrt-tvm compile MODEL -o OUT --sign KEY` (compile_model(..., sign=KEY)) and add the public "
    "key to nxrt.trusted_keys";
static const char* const RESTORE =
    "restore the model, its blob files and its .sig together from the signed compile output, or re-sign it "
    "with `nxrt-tvm compile MODEL -o OUT --sign KEY`";
MAYBE_UNUSED static const char* const NO_OPENSSL =
    "this plugin was built without OpenSSL's libcrypto, so it cannot check signatures and loads no code "
    "that is signed or must be; install OpenSSL's headers (e.g. `apt-get install libssl-dev`) and rebuild "
    "the plugin (`nxrt-tvm ort-plugin build`), or run the model with nxrt_tvm.InferenceSession";

typedef struct {
  char fingerprint[72];  /* "sha256:<hex of DER SubjectPublicKeyInfo>" */
  const char* algorithm; /* ECDSA_P256 or ED25519 */
  void* key;             /* EVP_PKEY*, owned */
} trusted_key;

struct nx_policy {
  trusted_key* keys; /* owned; n_keys of them */
  size_t n_keys;
  bool required;
};

struct nx_trust {
  char* problem; /* owned; why no blob of the model may load (reason; remedy), NULL when none */
  json* sidecar; /* owned; the signature file when it vouches for the model, NULL when unsigned */
};

/* The whole file, NUL-terminated (caller frees); NULL if unreadable. */
MAYBE_UNUSED static char* read_file(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, n = 0;
  char* buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n - 1, f);
    if (n < cap - 1) break;
    char* grown = realloc(buf, cap * 2);
    if (!grown) { free(buf); buf = NULL; break; }
    buf = grown;
    cap *= 2;
  }
  bool failed = ferror(f);
  fclose(f);
  if (!buf || failed) { free(buf); return NULL; }
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

MAYBE_UNUSED static int file_sha256(const char* path, char out[65]) {
  FILE* f = fopen(path, "rb");
  if (!f) return 1;
  unsigned char* buf = malloc(1 << 20);
  sha256_ctx c;
  sha256_init(&c);
  size_t got;
  while (buf && (got = fread(buf, 1, 1 << 20, f)) > 0) sha256_update(&c, buf, got);
  bool failed = !buf || ferror(f);
  free(buf);
  fclose(f);
  if (failed) return 1;
  sha256_final(&c, out);
  return 0;
}

/* ---- the session's policy ---- */

static char* config_entry(const OrtApi* api, const OrtSessionOptions* options, const char* key) {
  int has = 0;
  size_t size = 0;
  if (!options || !ort_ok(api, api->HasSessionConfigEntry(options, key, &has)) || !has ||
      !ort_ok(api, api->GetSessionConfigEntry(options, key, NULL, &size)))
    return NULL;
  char* value = calloc(size + 1, 1);
  if (value && !ort_ok(api, api->GetSessionConfigEntry(options, key, value, &size))) {
    free(value);
    return NULL;
  }
  return value;
}

static char* strip(char* s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

#ifdef NXRT_HAVE_OPENSSL
static const char* key_algorithm(EVP_PKEY* key) {
  int id = EVP_PKEY_base_id(key);
  if (id == EVP_PKEY_ED25519) return ED25519;
  if (id != EVP_PKEY_EC) return NULL;
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  char group[64] = "";
  size_t n = 0;
  if (EVP_PKEY_get_utf8_string_param(key, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group, &n) != 1) return NULL;
  return !strcmp(group, "prime256v1") || !strcmp(group, "P-256") ? ECDSA_P256 : NULL;
#else
  const EC_KEY* ec = EVP_PKEY_get0_EC_KEY(key);
  return ec && EC_GROUP_get_curve_name(EC_KEY_get0_group(ec)) == NID_X9_62_prime256v1 ? ECDSA_P256 : NULL;
#endif
}

/* A PEM public key, or an X.509 certificate standing for its key (no chain or expiry check: trusting the
 * file is trusting the key), as signing.py load_public_key. */
static int load_key(const char* path, trusted_key* out, char* why, size_t why_len) {
  size_t len = 0;
  char* pem = read_file(path, &len);
  if (!pem) return WHY("cannot read trusted key '%s' (no such file, or unreadable): give a PEM public key or certificate", path);
  BIO* bio = BIO_new_mem_buf(pem, (int)len);
  EVP_PKEY* key = NULL;
  if (bio && strstr(pem, "-----BEGIN CERTIFICATE-----")) {
    X509* cert = PEM_read_bio_X509(bio, NULL, NULL, NULL);
    if (cert) key = X509_get_pubkey(cert);
    X509_free(cert);
  } else if (bio) {
    key = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
  }
  BIO_free(bio);
  free(pem);
  ERR_clear_error(); /* leave OpenSSL's error queue as found: the process may use it elsewhere */
  if (!key) return WHY("cannot read trusted key '%s' (not a PEM public key or certificate): give a PEM public key or certificate", path);
  out->algorithm = key_algorithm(key);
  unsigned char* der = NULL;
  int n = out->algorithm ? i2d_PUBKEY(key, &der) : -1;
  if (n <= 0) {
    EVP_PKEY_free(key);
    OPENSSL_free(der);
    ERR_clear_error();
    return WHY(out->algorithm ? "cannot encode trusted key '%s'" :
               "unsupported key in '%s': use an ECDSA P-256 or Ed25519 key (`nxrt-tvm keygen`)", path);
  }
  char hex[65];
  sha256_hex(der, (size_t)n, hex);
  OPENSSL_free(der);
  snprintf(out->fingerprint, sizeof out->fingerprint, "sha256:%s", hex);
  out->key = key;
  return 0;
}

static bool verifies(const trusted_key* k, const char* algorithm, const unsigned char* sig, size_t sig_len,
                     const char* payload, size_t payload_len) {
  if (strcmp(algorithm, k->algorithm)) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok = ctx &&
            EVP_DigestVerifyInit(ctx, NULL, strcmp(k->algorithm, ED25519) ? EVP_sha256() : NULL, NULL, k->key) == 1 &&
            EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char*)payload, payload_len) == 1;
  EVP_MD_CTX_free(ctx);
  ERR_clear_error();
  return ok;
}
#endif

int policy_load(const OrtApi* api, const OrtSessionOptions* options, nx_policy** out, char* why, size_t why_len) {
  *out = NULL;
  char* keys = config_entry(api, options, "nxrt.trusted_keys");
  char* flag = config_entry(api, options, "nxrt.require_signature");
  nx_policy* p = calloc(1, sizeof *p);
  int rc = 1;
  size_t named = 0;
  if (!p) { WHY("out of memory"); goto done; }
  if (flag) { /* as nxrt_tvm.options.as_bool */
    char* v = strip(flag);
    for (char* c = v; *c; c++) *c = (char)tolower((unsigned char)*c);
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on")) {
      p->required = true;
    } else if (strcmp(v, "0") && strcmp(v, "false") && strcmp(v, "no") && strcmp(v, "off")) {
      WHY("session config 'nxrt.require_signature' must be '0' or '1' (or true/false), got '%s'", v);
      goto done;
    }
  }
  for (char *rest = keys, *part; rest && (part = strsep(&rest, ",;"));) { /* paths, ',' or ';' separated */
    char* path = strip(part);
    if (!*path) continue;
    named++;
#ifdef NXRT_HAVE_OPENSSL
    trusted_key* grown = realloc(p->keys, (p->n_keys + 1) * sizeof *grown);
    if (!grown) { WHY("out of memory"); goto done; }
    p->keys = grown;
    if (load_key(path, &p->keys[p->n_keys], why, why_len)) goto done;
    p->n_keys++;
#endif
  }
  if (p->required && !named) { /* digests alone authenticate nothing */
    WHY("nxrt.require_signature='1' needs nxrt.trusted_keys: the public keys whose signatures count");
    goto done;
  }
  *out = p;
  p = NULL;
  rc = 0;
done:
  policy_free(p);
  free(keys);
  free(flag);
  return rc;
}

void policy_free(nx_policy* p) {
  if (!p) return;
#ifdef NXRT_HAVE_OPENSSL
  for (size_t i = 0; i < p->n_keys; i++) EVP_PKEY_free(p->keys[i].key);
#endif
  free(p->keys);
  free(p);
}

/* ---- one model's signature ---- */

MAYBE_UNUSED static int b64(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Strict base64 (Python's b64decode(validate=True)): the alphabet, '=' padding only at the end, whole quads. */
MAYBE_UNUSED static unsigned char* base64_decode(const char* s, size_t n, size_t* out_len) {
  size_t pad = n >= 1 && s[n - 1] == '=' ? (n >= 2 && s[n - 2] == '=' ? 2 : 1) : 0;
  if (n % 4) return NULL;
  unsigned char* out = malloc(n / 4 * 3 + 1);
  if (!out) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i += 4) {
    int v[4];
    for (int j = 0; j < 4; j++) {
      v[j] = i + (size_t)j >= n - pad ? 0 : b64(s[i + j]);
      if (v[j] < 0) { free(out); return NULL; }
    }
    unsigned long quad = (unsigned long)v[0] << 18 | (unsigned long)v[1] << 12 | (unsigned long)v[2] << 6 | (unsigned long)v[3];
    out[k++] = (unsigned char)(quad >> 16);
    out[k++] = (unsigned char)(quad >> 8);
    out[k++] = (unsigned char)quad;
  }
  *out_len = k - pad;
  return out;
}

static const char* base_name(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static nx_trust* refuse(nx_trust* t, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static nx_trust* refuse(nx_trust* t, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  t->problem = strdup(msg);
  if (!t->problem) { free(t); return NULL; }
  return t;
}

static const char* string_at(const json* obj, const char* key) {
  const json* v = json_get(obj, key);
  return v && v->kind == JSON_STRING ? v->str : NULL;
}

/* Why the signature file cannot be read as signing.py writes it; NULL when it can. */
MAYBE_UNUSED static const char* malformed(const json* raw) {
  const json* manifest = json_get(raw, "manifest");
  if (!raw || raw->kind != JSON_OBJECT) return "not a JSON object";
  if (!manifest || manifest->kind != JSON_OBJECT) return "no manifest";
  const char* format = string_at(manifest, "format");
  if (!format || strcmp(format, SIGNATURE_FORMAT)) return "its format is not " SIGNATURE_FORMAT;
  const json* model = json_get(manifest, "model");
  const json* blobs = json_get(manifest, "blobs");
  if (!string_at(model, "name") || !string_at(model, "sha256")) return "its manifest names no model and sha256";
  if (!blobs || blobs->kind != JSON_OBJECT) return "its manifest lists no blobs";
  for (size_t i = 0; i < blobs->count; i++)
    if (blobs->items[i]->kind != JSON_STRING) return "a blob's digest is not a string";
  if (!string_at(raw, "algorithm") || !string_at(raw, "key_fingerprint") || !string_at(raw, "signature"))
    return "no algorithm, key_fingerprint or signature";
  return NULL;
}

nx_trust* trust_model(const nx_policy* policy, const char* model_path) {
  nx_trust* t = calloc(1, sizeof *t);
  if (!t) return NULL;
  bool required = policy && policy->required;
#ifndef NXRT_HAVE_OPENSSL
  if (required) return refuse(t, "nxrt.require_signature is set, but %s", NO_OPENSSL);
#endif
  if (!model_path || !*model_path) {
    if (!required) return t;
    return refuse(t, "the model was given as bytes or a ModelProto, so its signature file cannot be found; "
                     "open the model from its file path, with its .sig beside it");
  }
  char sidecar[PATH_MAX + 8];
  snprintf(sidecar, sizeof sidecar, "%s.sig", model_path);
  const char* name = base_name(model_path);
  struct stat sb;
  if (stat(sidecar, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    if (!required) return t;
    return refuse(t, "no signature file %s.sig beside the model; %s", name, SIGN);
  }
#ifndef NXRT_HAVE_OPENSSL
  return refuse(t, "the model is signed (%s.sig), but %s", name, NO_OPENSSL);
#else
  size_t len = 0;
  char* text = read_file(sidecar, &len);
  json* raw = text ? json_parse(text, len) : NULL;
  free(text);
  const char* problem = !text ? "cannot read it" : !raw ? "not JSON" : malformed(raw);
  const json* manifest = json_get(raw, "manifest");
  const char* signature = problem ? NULL : string_at(raw, "signature");
  size_t sig_len = 0;
  unsigned char* sig = signature ? base64_decode(signature, strlen(signature), &sig_len) : NULL;
  if (!problem && !sig) problem = "its signature is not base64";
  if (problem) {
    json_free(raw);
    return refuse(t, "signature file %s.sig is unreadable (%s); %s", name, problem, RESTORE);
  }
  const char* signer = string_at(raw, "key_fingerprint");
  if (policy && policy->n_keys) {
    const trusted_key* key = NULL;
    for (size_t i = 0; i < policy->n_keys && !key; i++)
      if (!strcmp(policy->keys[i].fingerprint, signer)) key = &policy->keys[i];
    if (!key) {
      t = refuse(t, "signed by key %s, which is not among the trusted keys (nxrt.trusted_keys); add the signer's "
                    "public key (PEM or certificate) to nxrt.trusted_keys if you trust it, or re-sign with "
                    "`nxrt-tvm compile MODEL -o OUT --sign KEY` using a trusted key", signer);
      goto done;
    }
    char* payload = json_canonical(manifest); /* the bytes signing.py signed: its _canonical(manifest) */
    bool ok = payload && verifies(key, string_at(raw, "algorithm"), sig, sig_len, payload, strlen(payload));
    free(payload);
    if (!ok) {
      t = refuse(t, "the signature in %s.sig does not verify with trusted key %s (the manifest or the signature "
                    "was edited); %s", name, signer, RESTORE);
      goto done;
    }
  }
  char digest[65];
  const char* want = string_at(json_get(manifest, "model"), "sha256");
  if (file_sha256(model_path, digest) || strcmp(digest, want)) {
    t = refuse(t, "digest of %s differs from the signed manifest (changed after signing); %s", name, RESTORE);
    goto done;
  }
  t->sidecar = raw; /* vouches for the model: its blob list is checked per node */
  raw = NULL;
done:
  free(sig);
  json_free(raw);
  return t;
#endif
}

int trust_check_blob(const nx_trust* t, const char* external_path, const unsigned char* blob, size_t len, char* why,
                     size_t why_len) {
  if (!t) return WHY("out of memory while checking the model's signature");
  if (t->problem) return WHY("%s", t->problem);
  if (!t->sidecar || !external_path) return 0; /* unsigned and allowed, or embedded: the model's digest covers it */
  const char* want = string_at(json_get(json_get(t->sidecar, "manifest"), "blobs"), external_path);
  if (!want) return WHY("the signed manifest does not list its blob '%s'; %s", external_path, RESTORE);
  char digest[65];
  sha256_hex(blob, len, digest);
  if (strcmp(digest, want))
    return WHY("digest of %s differs from the signed manifest (changed after signing); %s", external_path, RESTORE);
  return 0;
}

void trust_free(nx_trust* t) {
  if (!t) return;
  free(t->problem);
  json_free(t->sidecar);
  free(t);
}
