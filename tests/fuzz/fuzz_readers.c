/*
 * libFuzzer target: the CLI's file readers (cli/io.c) on arbitrary bytes. The first byte picks
 * the format (even: .npy, odd: safetensors); the rest is the file. A reader must either fail
 * with a one-line message naming the file, or return arrays whose sizes agree with their
 * shapes; never crash, leak or read out of bounds (run under ASan and UBSan).
 */
#include "io.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_array(const cp_array *a)
{
    int64_t n = 1;
    for (int i = 0; i < a->ndim; ++i)
        n *= a->shape[i];
    if (a->ndim < 0 || a->ndim > CP_IO_MAX_DIMS || n != a->numel || !a->data)
        __builtin_trap();
    volatile float sink = 0.0f;
    for (int64_t i = 0; i < a->numel; ++i) /* every element was written */
        sink += a->data[i] * 0.0f;
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char err[512] = "";
    const char *name = "fuzz.bin";
    if (data[0] % 2 == 0) {
        cp_array a;
        if (cp_npy_parse(data + 1, size - 1, name, &a, err, sizeof err) == 0) {
            check_array(&a);
            cp_array_free(&a);
        } else if (strncmp(err, "fuzz.bin: ", 10) != 0 || strchr(err, '\n')) {
            __builtin_trap();
        }
    } else {
        cp_model_tensors t;
        if (cp_safetensors_parse_model(data + 1, size - 1, name, &t, err, sizeof err) == 0) {
            check_array(&t.weight);
            check_array(&t.conv_bias);
            check_array(&t.bias);
            cp_model_tensors_free(&t);
        } else if (strncmp(err, "fuzz.bin: ", 10) != 0 || strchr(err, '\n')) {
            __builtin_trap();
        }
    }
    return 0;
}
