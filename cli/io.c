/*
 * The CLI's file formats (see io.h). Files and memory buffers go through one "source" with a
 * read-at-offset operation, so the fuzz harness exercises exactly the checks a file meets.
 * The safetensors header is JSON and is parsed by cJSON.
 */
#define _POSIX_C_SOURCE 200809L /* fseeko, ftello, mkstemp, fsync */
#define _XOPEN_SOURCE 700       /* realpath */

#include "io.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* A header larger than this is refused (numpy writes a few hundred bytes; safetensors' own
 * reader caps its JSON at 100 MB). */
#define NPY_HEADER_MAX ((uint64_t)1 << 20)
#define ST_HEADER_MAX ((uint64_t)100 << 20)
#define CONVERT_CHUNK 65536 /* elements converted per read */

static int fail(char *err, size_t n, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t n, const char *name, const char *fmt, ...)
{
    int k = snprintf(err, n, "%s: ", name);
    if (k < 0 || (size_t)k >= n)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, n - (size_t)k, fmt, ap);
    va_end(ap);
    /* One line of plain text whatever a file put into the names it quotes. */
    for (char *c = err; *c; ++c)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c == 0x7f)
            *c = '?';
    return -1;
}

void cp_array_free(cp_array *a)
{
    free(a->data);
    memset(a, 0, sizeof *a);
}

void cp_model_tensors_free(cp_model_tensors *t)
{
    cp_array_free(&t->weight);
    cp_array_free(&t->conv_bias);
    cp_array_free(&t->bias);
}

/* ---- sources: a file or a memory buffer, read at an offset ---- */

typedef struct source {
    FILE *f;
    const unsigned char *mem;
    uint64_t len;
    const char *name;
} source;

/* Reads n bytes at off; the caller has checked off + n <= len. */
static int src_read(const source *s, uint64_t off, void *dst, size_t n, char *err, size_t errlen)
{
    if (s->mem) {
        memcpy(dst, s->mem + off, n);
        return 0;
    }
    if (fseeko(s->f, (off_t)off, SEEK_SET) != 0 || fread(dst, 1, n, s->f) != n)
        return fail(err, errlen, s->name, "read error at byte %llu: %s", (unsigned long long)off,
                    ferror(s->f) ? strerror(errno) : "unexpected end of file");
    return 0;
}

static int src_open(source *s, const char *path, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->name = path;
    s->f = fopen(path, "rb");
    if (!s->f)
        return fail(err, errlen, path, "cannot open: %s", strerror(errno));
    if (fseeko(s->f, 0, SEEK_END) != 0) {
        fclose(s->f);
        return fail(err, errlen, path, "cannot seek (not a regular file?)");
    }
    const off_t end = ftello(s->f);
    if (end < 0) {
        fclose(s->f);
        return fail(err, errlen, path, "cannot tell its size: %s", strerror(errno));
    }
    s->len = (uint64_t)end;
    return 0;
}

/* ---- element conversion ---- */

static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf, NaN (payload kept) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal half: normalise */
        int e = -1;
        uint32_t m = man;
        do {
            ++e;
            m <<= 1;
        } while (!(m & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

typedef enum elem_kind { ELEM_F32, ELEM_F16, ELEM_BF16 } elem_kind;

static size_t elem_size(elem_kind k) { return k == ELEM_F32 ? 4 : 2; }

/* Reads numel elements of kind k at off (little-endian) into dst as float32. */
static int read_floats(const source *s, uint64_t off, int64_t numel, elem_kind k, float *dst, char *err,
                       size_t errlen)
{
    if (k == ELEM_F32) {
        if (src_read(s, off, dst, (size_t)numel * 4, err, errlen))
            return -1;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (int64_t i = 0; i < numel; ++i) {
            unsigned char *b = (unsigned char *)(dst + i);
            unsigned char t0 = b[0], t1 = b[1];
            b[0] = b[3], b[1] = b[2], b[2] = t1, b[3] = t0;
        }
#endif
        return 0;
    }
    unsigned char *buf = malloc(CONVERT_CHUNK * 2);
    if (!buf)
        return fail(err, errlen, s->name, "out of memory");
    for (int64_t i0 = 0; i0 < numel; i0 += CONVERT_CHUNK) {
        const int64_t m = numel - i0 < CONVERT_CHUNK ? numel - i0 : CONVERT_CHUNK;
        if (src_read(s, off + (uint64_t)i0 * 2, buf, (size_t)m * 2, err, errlen)) {
            free(buf);
            return -1;
        }
        for (int64_t i = 0; i < m; ++i) {
            const uint16_t v = (uint16_t)(buf[2 * i] | (buf[2 * i + 1] << 8));
            if (k == ELEM_F16) {
                dst[i0 + i] = half_to_float(v);
            } else {
                const uint32_t bits = (uint32_t)v << 16;
                memcpy(&dst[i0 + i], &bits, sizeof bits);
            }
        }
    }
    free(buf);
    return 0;
}

/* numel of a shape, or -1 if it overflows int64 or is past what size_t bytes can hold. */
static int64_t shape_numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] != 0 && n > (INT64_MAX / 4) / shape[i])
            return -1;
        n *= shape[i];
    }
    return n;
}

static int alloc_array(cp_array *a, const source *s, char *err, size_t errlen)
{
    if ((uint64_t)a->numel > SIZE_MAX / sizeof(float))
        return fail(err, errlen, s->name, "%lld elements do not fit in memory", (long long)a->numel);
    a->data = malloc((size_t)(a->numel ? a->numel : 1) * sizeof(float));
    if (!a->data)
        return fail(err, errlen, s->name, "out of memory for %lld elements", (long long)a->numel);
    return 0;
}

/* ---- .npy ---- */

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        ++c->p;
}

static int eat(cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        ++c->p;
        return 1;
    }
    return 0;
}

/* A Python string literal in single or double quotes, no escapes (numpy writes none). */
static int parse_pystr(cursor *c, char *out, size_t n)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return 0;
    const char q = *c->p++;
    size_t k = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || k + 1 >= n)
            return 0;
        out[k++] = *c->p++;
    }
    if (c->p >= c->end)
        return 0;
    ++c->p;
    out[k] = '\0';
    return 1;
}

static int parse_pyint(cursor *c, int64_t *v)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return 0;
    int64_t r = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        const int d = *c->p++ - '0';
        if (r > (INT64_MAX - d) / 10)
            return 0;
        r = r * 10 + d;
    }
    if (c->p < c->end && *c->p == 'L') /* Python 2 long */
        ++c->p;
    *v = r;
    return 1;
}

typedef struct npy_info {
    elem_kind kind;
    const char *dtype;
    int ndim;
    int64_t shape[CP_IO_MAX_DIMS];
    uint64_t data_off;
} npy_info;

/* The header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } */
static int npy_dict(cursor *c, const char *name, npy_info *info, char *err, size_t errlen)
{
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!eat(c, '{'))
        return fail(err, errlen, name, "malformed .npy header: it does not start with a dict");
    while (!eat(c, '}')) {
        char key[32], val[32];
        if (!parse_pystr(c, key, sizeof key) || !eat(c, ':'))
            return fail(err, errlen, name, "malformed .npy header: expected 'key': value");
        if (strcmp(key, "descr") == 0) {
            if (!parse_pystr(c, val, sizeof val))
                return fail(err, errlen, name, "malformed .npy header: descr is not a string");
            if (strcmp(val, "<f4") == 0) {
                info->kind = ELEM_F32;
                info->dtype = "<f4";
            } else if (strcmp(val, "<f2") == 0) {
                info->kind = ELEM_F16;
                info->dtype = "<f2";
            } else {
                return fail(err, errlen, name,
                            "dtype '%s' is not supported: need little-endian float32 ('<f4') or float16 ('<f2')",
                            val);
            }
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            skip_ws(c);
            if (c->end - c->p >= 5 && strncmp(c->p, "False", 5) == 0) {
                c->p += 5;
            } else if (c->end - c->p >= 4 && strncmp(c->p, "True", 4) == 0) {
                return fail(err, errlen, name,
                            "fortran_order is True: save the array in C order (np.ascontiguousarray)");
            } else {
                return fail(err, errlen, name, "malformed .npy header: fortran_order is not True or False");
            }
            have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (!eat(c, '('))
                return fail(err, errlen, name, "malformed .npy header: shape is not a tuple");
            info->ndim = 0;
            while (!eat(c, ')')) {
                int64_t v;
                if (info->ndim == CP_IO_MAX_DIMS)
                    return fail(err, errlen, name, "more than %d dimensions", CP_IO_MAX_DIMS);
                if (!parse_pyint(c, &v))
                    return fail(err, errlen, name,
                                "malformed .npy header: shape entries must be non-negative integers below 2^63");
                info->shape[info->ndim++] = v;
                if (!eat(c, ',')) {
                    if (!eat(c, ')'))
                        return fail(err, errlen, name, "malformed .npy header: shape tuple not closed");
                    break;
                }
            }
            have_shape = 1;
        } else {
            return fail(err, errlen, name, "unexpected key '%s' in the .npy header", key);
        }
        if (!eat(c, ',')) {
            if (!eat(c, '}'))
                return fail(err, errlen, name, "malformed .npy header: expected ',' or '}'");
            break;
        }
    }
    skip_ws(c);
    if (c->p != c->end)
        return fail(err, errlen, name, "malformed .npy header: text after the dict");
    if (!have_descr || !have_order || !have_shape)
        return fail(err, errlen, name, "the .npy header lacks %s",
                    !have_descr ? "'descr'" : !have_order ? "'fortran_order'" : "'shape'");
    return 0;
}

static int npy_load(const source *s, cp_array *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    unsigned char pre[12];
    if (s->len < 10)
        return fail(err, errlen, s->name, "not a .npy file (%llu bytes, shorter than the preamble)",
                    (unsigned long long)s->len);
    if (src_read(s, 0, pre, s->len < 12 ? 10 : 12, err, errlen))
        return -1;
    if (memcmp(pre, "\x93NUMPY", 6) != 0)
        return fail(err, errlen, s->name, "not a .npy file (bad magic)");
    const int major = pre[6];
    uint64_t hlen, hstart;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (s->len < 12)
            return fail(err, errlen, s->name, "truncated .npy preamble");
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
        hstart = 12;
    } else {
        return fail(err, errlen, s->name, ".npy format version %d.%d is not supported (1.0 to 3.0 are)", major,
                    pre[7]);
    }
    if (hlen > NPY_HEADER_MAX)
        return fail(err, errlen, s->name, ".npy header of %llu bytes is larger than 1 MiB",
                    (unsigned long long)hlen);
    if (hstart + hlen > s->len)
        return fail(err, errlen, s->name, "the .npy header (%llu bytes) runs past the end of the file (%llu bytes)",
                    (unsigned long long)hlen, (unsigned long long)s->len);
    char *text = malloc((size_t)hlen + 1);
    if (!text)
        return fail(err, errlen, s->name, "out of memory");
    if (src_read(s, hstart, text, (size_t)hlen, err, errlen)) {
        free(text);
        return -1;
    }
    text[hlen] = '\0';
    npy_info info;
    memset(&info, 0, sizeof info);
    cursor c = {text, text + hlen};
    const int rc = npy_dict(&c, s->name, &info, err, errlen);
    free(text);
    if (rc)
        return -1;
    info.data_off = hstart + hlen;

    const int64_t numel = shape_numel(info.shape, info.ndim);
    if (numel < 0)
        return fail(err, errlen, s->name, "the declared shape overflows");
    const uint64_t need = (uint64_t)numel * elem_size(info.kind), have = s->len - info.data_off;
    if (need != have)
        return fail(err, errlen, s->name, "the header declares %llu bytes of data, the file holds %llu",
                    (unsigned long long)need, (unsigned long long)have);
    a->ndim = info.ndim;
    memcpy(a->shape, info.shape, sizeof info.shape);
    a->numel = numel;
    a->dtype = info.dtype;
    if (alloc_array(a, s, err, errlen))
        return -1;
    if (read_floats(s, info.data_off, numel, info.kind, a->data, err, errlen)) {
        cp_array_free(a);
        return -1;
    }
    return 0;
}

int cp_npy_read(const char *path, cp_array *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    source s;
    if (src_open(&s, path, err, errlen))
        return -1;
    const int rc = npy_load(&s, a, err, errlen);
    fclose(s.f);
    return rc;
}

int cp_npy_parse(const unsigned char *buf, size_t len, const char *name, cp_array *a, char *err, size_t errlen)
{
    const source s = {NULL, buf, len, name};
    return npy_load(&s, a, err, errlen);
}

/* ---- outputs ---- */

void cp_out_discard(cp_out_file *o)
{
    if (o->f)
        fclose(o->f);
    if (o->tmp)
        unlink(o->tmp);
    free(o->tmp);
    free(o->final);
    memset(o, 0, sizeof *o);
}

int cp_out_open(cp_out_file *o, const char *path, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->path = path;
    struct stat st;
    const int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode))
        return fail(err, errlen, path, "is a directory");
    if (exists && !S_ISREG(st.st_mode))
        return 0; /* a FIFO or a device: in place, opened when written */
    /* A symlink to a file: replace the file, not the link. */
    o->final = exists ? realpath(path, NULL) : strdup(path);
    if (!o->final)
        return fail(err, errlen, path, "cannot resolve: %s", strerror(errno));
    const size_t n = strlen(o->final) + sizeof ".XXXXXX";
    o->tmp = malloc(n);
    if (!o->tmp) {
        cp_out_discard(o);
        return fail(err, errlen, path, "out of memory");
    }
    snprintf(o->tmp, n, "%s.XXXXXX", o->final);
    const int fd = mkstemp(o->tmp);
    if (fd < 0) {
        const int e = errno;
        free(o->tmp);
        o->tmp = NULL;
        cp_out_discard(o);
        return fail(err, errlen, path, "cannot create a file in its directory: %s", strerror(e));
    }
    /* mkstemp makes the file 0600: give it the target's mode, or what fopen would create. */
    mode_t mode = 0;
    if (exists) {
        mode = st.st_mode & 07777;
    } else {
        mode = umask(0);
        umask(mode);
        mode = 0666 & ~mode;
    }
    o->f = fdopen(fd, "wb");
    if (!o->f || fchmod(fd, mode) != 0) {
        const int e = errno;
        if (!o->f)
            close(fd);
        cp_out_discard(o);
        return fail(err, errlen, path, "cannot create: %s", strerror(e));
    }
    return 0;
}

int cp_npy_write_out(cp_out_file *o, const float *data, int ndim, const int64_t *shape, char *err, size_t errlen)
{
    char dict[256];
    int k = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int i = 0; i < ndim; ++i)
        k += snprintf(dict + k, sizeof dict - (size_t)k, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
    k += snprintf(dict + k, sizeof dict - (size_t)k, "), }");
    /* Version 1.0: 10-byte preamble, the dict padded with spaces and ended by '\n' so that the
     * data starts on a multiple of 64 bytes. */
    const size_t total = ((size_t)10 + (size_t)k + 1 + 63) / 64 * 64, hlen = total - 10;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    if (!o->tmp && !o->f) {
        o->f = fopen(o->path, "wb");
        if (!o->f)
            return fail(err, errlen, o->path, "cannot create: %s", strerror(errno));
    }
    FILE *f = o->f;
    o->f = NULL;
    int64_t numel = 1;
    for (int i = 0; i < ndim; ++i)
        numel *= shape[i];
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)k, f) == (size_t)k;
    for (size_t i = (size_t)k; ok && i + 1 < hlen; ++i)
        ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF && fwrite(data, sizeof(float), (size_t)numel, f) == (size_t)numel;
    /* On disk before the rename: else a crash could leave the target renamed but empty. */
    ok = ok && fflush(f) == 0 && (!o->tmp || fsync(fileno(f)) == 0);
    int code = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        code = errno;
    }
    if (!ok) {
        if (o->tmp) {
            unlink(o->tmp);
            free(o->tmp);
            o->tmp = NULL;
        }
        return fail(err, errlen, o->path, "write error: %s%s", strerror(code),
                    o->final ? " (the file is left as it was)" : "");
    }
    return 0;
}

int cp_out_commit(cp_out_file *o, char *err, size_t errlen)
{
    if (!o->tmp)
        return 0;
    if (rename(o->tmp, o->final) != 0) {
        const int e = errno;
        unlink(o->tmp);
        free(o->tmp);
        o->tmp = NULL;
        return fail(err, errlen, o->path, "cannot replace it: %s", strerror(e));
    }
    free(o->tmp);
    o->tmp = NULL;
    return 0;
}

int cp_npy_write(const char *path, const float *data, int ndim, const int64_t *shape, char *err, size_t errlen)
{
    cp_out_file o;
    int rc = cp_out_open(&o, path, err, errlen);
    if (!rc)
        rc = cp_npy_write_out(&o, data, ndim, shape, err, errlen);
    if (!rc)
        rc = cp_out_commit(&o, err, errlen);
    cp_out_discard(&o);
    return rc;
}

/* ---- safetensors ---- */

/* A non-negative integral JSON number below 2^53, or -1. */
static int64_t json_count(const cJSON *v)
{
    if (!cJSON_IsNumber(v))
        return -1;
    const double d = v->valuedouble;
    if (!(d >= 0.0 && d <= 9007199254740992.0) || d != (double)(int64_t)d)
        return -1;
    return (int64_t)d;
}

static int st_tensor(const source *s, const cJSON *root, const char *key, uint64_t data_start, uint64_t data_len,
                     cp_array *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!t)
        return fail(err, errlen, s->name,
                    "has no tensor '%s' (a Model state_dict holds conv.weight, conv.bias and bias)", key);
    if (!cJSON_IsObject(t))
        return fail(err, errlen, s->name, "entry '%s' is not an object", key);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off))
        return fail(err, errlen, s->name, "tensor '%s' lacks a string dtype, a shape array or data_offsets", key);
    elem_kind kind;
    if (strcmp(dt->valuestring, "F32") == 0) {
        kind = ELEM_F32;
        a->dtype = "F32";
    } else if (strcmp(dt->valuestring, "F16") == 0) {
        kind = ELEM_F16;
        a->dtype = "F16";
    } else if (strcmp(dt->valuestring, "BF16") == 0) {
        kind = ELEM_BF16;
        a->dtype = "BF16";
    } else {
        return fail(err, errlen, s->name, "tensor '%s' has dtype '%.16s'; need F32, F16 or BF16", key,
                    dt->valuestring);
    }
    const int ndim = cJSON_GetArraySize(sh);
    if (ndim > CP_IO_MAX_DIMS)
        return fail(err, errlen, s->name, "tensor '%s' has %d dimensions, more than %d", key, ndim, CP_IO_MAX_DIMS);
    a->ndim = ndim;
    for (int i = 0; i < ndim; ++i) {
        a->shape[i] = json_count(cJSON_GetArrayItem(sh, i));
        if (a->shape[i] < 0)
            return fail(err, errlen, s->name, "tensor '%s': shape entries must be non-negative integers", key);
    }
    a->numel = shape_numel(a->shape, ndim);
    if (a->numel < 0)
        return fail(err, errlen, s->name, "tensor '%s': the shape overflows", key);
    if (cJSON_GetArraySize(off) != 2)
        return fail(err, errlen, s->name, "tensor '%s': data_offsets must be [begin, end]", key);
    const int64_t b = json_count(cJSON_GetArrayItem(off, 0)), e = json_count(cJSON_GetArrayItem(off, 1));
    if (b < 0 || e < 0)
        return fail(err, errlen, s->name, "tensor '%s': data_offsets must be non-negative integers below 2^53", key);
    if (e < b || (uint64_t)e > data_len)
        return fail(err, errlen, s->name,
                    "tensor '%s': data_offsets [%lld, %lld] are not inside the data section (%llu bytes)", key,
                    (long long)b, (long long)e, (unsigned long long)data_len);
    const uint64_t need = (uint64_t)a->numel * elem_size(kind);
    if ((uint64_t)(e - b) != need)
        return fail(err, errlen, s->name, "tensor '%s': data_offsets span %lld bytes, its shape and dtype need %llu",
                    key, (long long)(e - b), (unsigned long long)need);
    if (alloc_array(a, s, err, errlen))
        return -1;
    if (read_floats(s, data_start + (uint64_t)b, a->numel, kind, a->data, err, errlen)) {
        cp_array_free(a);
        return -1;
    }
    return 0;
}

/* A header entry's name and data_offsets [b, e) (b = e = -1: none usable, the entry is left to
 * st_tensor or ignored). */
typedef struct st_entry {
    const char *key;
    int64_t b, e;
} st_entry;

static int st_by_key(const void *a, const void *b)
{
    return strcmp(((const st_entry *)a)->key, ((const st_entry *)b)->key);
}

static int st_by_offset(const void *a, const void *b)
{
    const st_entry *x = (const st_entry *)a, *y = (const st_entry *)b;
    return (x->b > y->b) - (x->b < y->b);
}

/* The header as a whole: no key twice (cJSON keeps both, and would hand back the first), and
 * no two tensors' data_offsets sharing a byte (the format forbids it; a file that aliases
 * conv.weight and bias is not a state_dict). Sorted, so a header of many keys costs n log n. */
static int st_check_entries(const source *s, const cJSON *root, char *err, size_t errlen)
{
    const int n = cJSON_GetArraySize(root);
    if (n < 2)
        return 0;
    st_entry *ent = malloc((size_t)n * sizeof *ent);
    if (!ent)
        return fail(err, errlen, s->name, "out of memory");
    int m = 0;
    for (const cJSON *c = root->child; c && m < n; c = c->next) {
        st_entry *en = &ent[m++];
        en->key = c->string ? c->string : "";
        en->b = en->e = -1;
        const cJSON *off = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "data_offsets") : NULL;
        if (cJSON_IsArray(off) && cJSON_GetArraySize(off) == 2) {
            const int64_t b = json_count(cJSON_GetArrayItem(off, 0)), e = json_count(cJSON_GetArrayItem(off, 1));
            if (b >= 0 && e > b) {
                en->b = b;
                en->e = e;
            }
        }
    }
    int rc = 0;
    qsort(ent, (size_t)m, sizeof *ent, st_by_key);
    for (int i = 1; i < m && !rc; ++i)
        if (strcmp(ent[i - 1].key, ent[i].key) == 0)
            rc = fail(err, errlen, s->name, "the safetensors header holds key '%.64s' twice", ent[i].key);
    qsort(ent, (size_t)m, sizeof *ent, st_by_offset);
    for (int i = 1; i < m && !rc; ++i)
        if (ent[i - 1].b >= 0 && ent[i].b < ent[i - 1].e)
            rc = fail(err, errlen, s->name,
                      "tensors '%.64s' and '%.64s' overlap: data_offsets [%lld, %lld] and [%lld, %lld]",
                      ent[i - 1].key, ent[i].key, (long long)ent[i - 1].b, (long long)ent[i - 1].e,
                      (long long)ent[i].b, (long long)ent[i].e);
    free(ent);
    return rc;
}

static int st_load(const source *s, cp_model_tensors *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    unsigned char pre[8];
    if (s->len < 8)
        return fail(err, errlen, s->name, "not a safetensors file (%llu bytes, shorter than the 8-byte header size)",
                    (unsigned long long)s->len);
    if (src_read(s, 0, pre, 8, err, errlen))
        return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
        n = n << 8 | pre[i];
    if (n > ST_HEADER_MAX)
        return fail(err, errlen, s->name, "safetensors header size %llu is over the 100 MB limit",
                    (unsigned long long)n);
    if (n > s->len - 8)
        return fail(err, errlen, s->name, "safetensors header size %llu runs past the end of the file (%llu bytes)",
                    (unsigned long long)n, (unsigned long long)s->len);
    char *text = malloc((size_t)n + 1);
    if (!text)
        return fail(err, errlen, s->name, "out of memory");
    if (src_read(s, 8, text, (size_t)n, err, errlen)) {
        free(text);
        return -1;
    }
    text[n] = '\0';
    cJSON *root = cJSON_ParseWithLength(text, (size_t)n);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        const long pos = at && at >= text && at <= text + n ? (long)(at - text) : -1;
        free(text);
        return fail(err, errlen, s->name, "the safetensors header is not valid JSON (at byte %ld of it)", pos);
    }
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        fail(err, errlen, s->name, "the safetensors header is not a JSON object");
    } else {
        const uint64_t start = 8 + n, len = s->len - start;
        rc = st_check_entries(s, root, err, errlen);
        if (!rc)
            rc = st_tensor(s, root, "conv.weight", start, len, &t->weight, err, errlen);
        if (!rc)
            rc = st_tensor(s, root, "conv.bias", start, len, &t->conv_bias, err, errlen);
        if (!rc)
            rc = st_tensor(s, root, "bias", start, len, &t->bias, err, errlen);
    }
    cJSON_Delete(root);
    free(text);
    if (rc)
        cp_model_tensors_free(t);
    return rc;
}

int cp_safetensors_read_model(const char *path, cp_model_tensors *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    source s;
    if (src_open(&s, path, err, errlen))
        return -1;
    const int rc = st_load(&s, t, err, errlen);
    fclose(s.f);
    return rc;
}

int cp_safetensors_parse_model(const unsigned char *buf, size_t len, const char *name, cp_model_tensors *t,
                               char *err, size_t errlen)
{
    const source s = {NULL, buf, len, name};
    return st_load(&s, t, err, errlen);
}
