// Writes matmul fixtures computed by llama.cpp's own CPU backend (ggml), for the kernel tests
// in inference/src/kernels: random weights of a tensor type quantized by ggml, random
// activations, and the product ggml computes for them on the path llama.cpp takes at
// inference (the CPU_REPACK buffer where ggml repacks that type, tinyBLAS/vec_dot otherwise),
// at one thread. Only ggml's public API is used.
//
//   ./gen.sh    (builds this against the llama.cpp of scripts/build-llamacpp.sh and runs it)
//
// File format (little endian): "AGKF", u32 version 1, u32 ggml type, u32 rows, u32 cols,
// u32 n (columns of activations), u64 weight bytes, the weight rows as GGUF stores them,
// f32 x[n][cols], f32 y[n][rows].
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
// Roughly normal values with a few outliers, like weights and activations.
static float randn(float scale) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)(rng() % 20001) / 10000.0f - 1.0f;
    if (rng() % 97 == 0) s *= 6.0f;
    return s * scale;
}

static ggml_backend_buffer_type_t repack_buft(ggml_backend_t cpu) {
    ggml_backend_dev_t dev = ggml_backend_get_device(cpu);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!get) return NULL;
    for (ggml_backend_buffer_type_t *b = get(dev); b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS N SEED OUT\n", argv[0]);
        return 2;
    }
    const char *tname = argv[1];
    int rows = atoi(argv[2]), cols = atoi(argv[3]), n = atoi(argv[4]);
    rng_state = (uint64_t)atoll(argv[5]) * 0x9E3779B97F4A7C15ull | 1;
    enum ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *nm = ggml_type_name((enum ggml_type)t);
        if (nm && strcmp(nm, tname) == 0) type = (enum ggml_type)t;
    }
    if (type == GGML_TYPE_COUNT) {
        fprintf(stderr, "unknown type %s\n", tname);
        return 2;
    }
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 1);

    float *wf = malloc(sizeof(float) * rows * cols);
    for (int i = 0; i < rows * cols; i++) wf[i] = randn(0.02f);
    size_t wbytes = ggml_row_size(type, cols) * rows;
    void *wq = malloc(wbytes);
    if (type == GGML_TYPE_F32) {
        memcpy(wq, wf, wbytes);
    } else {
        ggml_quantize_chunk(type, wf, wq, 0, rows, cols, NULL);
    }
    float *x = malloc(sizeof(float) * n * cols);
    for (int i = 0; i < n * cols; i++) x[i] = randn(1.0f);

    struct ggml_init_params wp = {ggml_tensor_overhead() * 4, NULL, true};
    struct ggml_context *cw = ggml_init(wp);
    struct ggml_tensor *W = ggml_new_tensor_2d(cw, type, cols, rows);
    // The types ggml repacks on x86 (AVX2) when the row count is a multiple of 8.
    int repackable = (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_K || type == GGML_TYPE_IQ4_NL) && rows % 8 == 0;
    ggml_backend_buffer_type_t rb = repackable ? repack_buft(cpu) : NULL;
    ggml_backend_buffer_t wbuf = NULL;
    const char *path = "cpu";
    if (rb) {
        wbuf = ggml_backend_alloc_ctx_tensors_from_buft(cw, rb);
        if (wbuf) path = "repack";
    }
    if (!wbuf) wbuf = ggml_backend_alloc_ctx_tensors_from_buft(cw, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(W, wq, 0, wbytes);

    struct ggml_init_params gp = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), NULL, true};
    struct ggml_context *cg = ggml_init(gp);
    struct ggml_tensor *X = ggml_new_tensor_2d(cg, GGML_TYPE_F32, cols, n);
    struct ggml_tensor *Y = ggml_mul_mat(cg, W, X);
    struct ggml_cgraph *gf = ggml_new_graph(cg);
    ggml_build_forward_expand(gf, Y);
    ggml_backend_buffer_t gbuf = ggml_backend_alloc_ctx_tensors_from_buft(cg, ggml_backend_cpu_buffer_type());
    ggml_backend_tensor_set(X, x, 0, sizeof(float) * n * cols);
    if (ggml_backend_graph_compute(cpu, gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        return 1;
    }
    float *y = malloc(sizeof(float) * n * rows);
    ggml_backend_tensor_get(Y, y, 0, sizeof(float) * n * rows);

    FILE *f = fopen(argv[6], "wb");
    if (!f) return 1;
    uint32_t hdr[6] = {1, (uint32_t)type, (uint32_t)rows, (uint32_t)cols, (uint32_t)n, 0};
    fwrite("AGKF", 1, 4, f);
    fwrite(hdr, 4, 5, f);
    uint64_t wb = wbytes;
    fwrite(&wb, 8, 1, f);
    fwrite(wq, 1, wbytes, f);
    fwrite(x, 4, (size_t)n * cols, f);
    fwrite(y, 4, (size_t)n * rows, f);
    fclose(f);
    fprintf(stderr, "%s %dx%d n=%d via %s -> %s\n", tname, rows, cols, n, path, argv[6]);
    ggml_backend_buffer_free(gbuf);
    ggml_backend_buffer_free(wbuf);
    ggml_free(cg);
    ggml_free(cw);
    ggml_backend_free(cpu);
    return 0;
}
