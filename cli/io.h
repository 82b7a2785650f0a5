/*
 * The CLI's files: NumPy .npy arrays (format versions 1.0, 2.0 and 3.0, as numpy.lib.format
 * specifies them) and safetensors files (an 8-byte little-endian header size, a JSON header
 * mapping tensor names to dtype, shape and data offsets, then the data).
 *
 * Every reader validates what it is given before it trusts it: the magic and version, header
 * sizes against the file, the dtype, shapes against overflow and against the bytes present,
 * data offsets inside the data section. A failure returns -1 with one line in err that names
 * the file and the problem; nothing is allocated then. Arrays come back as float32 (float16 and
 * bfloat16 are widened exactly).
 */
#ifndef CONVPOOL_CLI_IO_H
#define CONVPOOL_CLI_IO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CP_IO_MAX_DIMS 8

typedef struct cp_array {
    int ndim;
    int64_t shape[CP_IO_MAX_DIMS];
    int64_t numel;
    const char *dtype; /* as the file named it ("<f4", "F16", ...), static storage */
    float *data;       /* numel floats, C order; free with cp_array_free */
} cp_array;

void cp_array_free(cp_array *a);

/* A .npy file of float32 ('<f4') or float16 ('<f2') in C order. */
int cp_npy_read(const char *path, cp_array *a, char *err, size_t errlen);
/* The same from memory (name is used in messages): the fuzz harness's entry point. */
int cp_npy_parse(const unsigned char *buf, size_t len, const char *name, cp_array *a, char *err,
                 size_t errlen);
/* Writes float32 data as a version 1.0 .npy file (cp_out_open, cp_npy_write_out, cp_out_commit). */
int cp_npy_write(const char *path, const float *data, int ndim, const int64_t *shape, char *err,
                 size_t errlen);

/* An output written whole or not at all: the data goes to a temporary file beside the target
 * (mkstemp in its directory, through a symlink resolved), is flushed to disk (fsync) and renamed
 * over the target, so a failed write (a full disk, a file-size limit) leaves what was there. A
 * target that exists and is not a regular file (a FIFO, /dev/null) is written in place. */
typedef struct cp_out_file {
    const char *path; /* the target as given, for messages */
    char *final;      /* the file rename replaces */
    char *tmp;        /* the temporary; NULL: written in place */
    FILE *f;
} cp_out_file;

/* Creates the temporary: a caller opens its outputs before it computes them, so that one which
 * cannot be created is reported first. */
int cp_out_open(cp_out_file *o, const char *path, char *err, size_t errlen);
/* Writes float32 data as a version 1.0 .npy file into o and closes it, flushed to disk. */
int cp_npy_write_out(cp_out_file *o, const float *data, int ndim, const int64_t *shape, char *err,
                     size_t errlen);
/* Renames the written temporary over the target. */
int cp_out_commit(cp_out_file *o, char *err, size_t errlen);
/* Closes and removes the temporary unless committed; frees o's names. Safe on a zeroed o. */
void cp_out_discard(cp_out_file *o);

/* The tensors a state_dict of the Model holds, by key, from a safetensors file: each of F32,
 * F16 or BF16. Other keys are ignored; a missing key is an error. */
typedef struct cp_model_tensors {
    cp_array weight;    /* "conv.weight" */
    cp_array conv_bias; /* "conv.bias" */
    cp_array bias;      /* "bias" */
} cp_model_tensors;

int cp_safetensors_read_model(const char *path, cp_model_tensors *t, char *err, size_t errlen);
int cp_safetensors_parse_model(const unsigned char *buf, size_t len, const char *name,
                               cp_model_tensors *t, char *err, size_t errlen);
void cp_model_tensors_free(cp_model_tensors *t);

#endif /* CONVPOOL_CLI_IO_H */
