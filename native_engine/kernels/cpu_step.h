/* One decode step in one OpenMP parallel region, shared by llama_decode_rows (cpu_decode.c, 1-3 rows) and
 * llama_decode_batch (cpu_batch.c, 4+ rows): how threads claim an op's chunks, the step's claiming state, and
 * each thread's own buffers. Defined in cpu_decode.c. */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef void (*chunk_fn)(const void *op, int64_t i);

typedef struct { /* a thread's own copies: residual and normed rows [T, H], int16 matmul input [T, K] + scales */
    float *residual, *h, *sx, *xsum;
    int16_t *x16;
} own_t;

void step_run_op(int64_t k, int32_t *flags, int32_t gen, int64_t chunks, chunk_fn fn, const void *op, int tid,
                 int nt, int64_t *progress);
void *step_scratch(size_t bytes, void **buf, size_t *cap);
int32_t step_begin(int64_t flag_count, int nt, int32_t **flags, int64_t **progress);
own_t step_own(int64_t T, int64_t H, int64_t K);
