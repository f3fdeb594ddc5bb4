/*
 * reduce.c — CPU twin of kernels/comm/reduce.cu: the reduction of n buffers,
 * element by element, over the buffers in the order given (so every rank
 * that reduces the same buffers in the same order gets bitwise the same
 * result): sum, avg, max, min over every dtype; bf16/fp16 accumulate in fp32
 * and round once. The shared-memory communicator reduces its slots with it.
 */
#include "comm/reduce.h"
#include "common/dtype.h"

/* element i: a = src[0][i] (red) src[1][i] ... in A, the accumulation type */
#define REDUCE_LOOP(T, A, LOAD, STORE)                                                     \
  do {                                                                                     \
    T *d = dst;                                                                            \
    for (int64_t i = 0; i < k; i++) {                                                      \
      A a = LOAD(((const T *)src[0])[i]);                                                  \
      for (int j = 1; j < n; j++) {                                                        \
        A b = LOAD(((const T *)src[j])[i]);                                                \
        if (red == DL_RED_MAX) a = b > a ? b : a;                                          \
        else if (red == DL_RED_MIN) a = b < a ? b : a;                                     \
        else a = dl_reduce_add_(a, b);                                                     \
      }                                                                                    \
      d[i] = STORE(red == DL_RED_AVG ? (A)(a / (A)n) : a);                                 \
    }                                                                                      \
  } while (0)

/* integer sums wrap (unsigned arithmetic), as on the GPU */
#define dl_reduce_add_(a, b) _Generic((a), int32_t: (int32_t)((uint32_t)(a) + (uint32_t)(b)),  \
                                      int64_t: (int64_t)((uint64_t)(a) + (uint64_t)(b)),       \
                                      default: (a) + (b))
#define SAME(x) (x)
#define U8(x) ((uint8_t)(x))

int dl_reduce_cpu(void *dst, char *const *src, int n, int64_t k, int dtype, int red, void *stream) {
  switch (dtype) {
  case DL_F32: REDUCE_LOOP(float, float, SAME, SAME); break;
  case DL_F64: REDUCE_LOOP(double, double, SAME, SAME); break;
  case DL_I32: REDUCE_LOOP(int32_t, int32_t, SAME, SAME); break;
  case DL_I64: REDUCE_LOOP(int64_t, int64_t, SAME, SAME); break;
  case DL_U8: REDUCE_LOOP(uint8_t, uint8_t, SAME, U8); break;
  case DL_BF16: REDUCE_LOOP(uint16_t, float, dl_bf16_to_f32, dl_f32_to_bf16); break;
  case DL_F16: REDUCE_LOOP(uint16_t, float, dl_f16_to_f32, dl_f32_to_f16); break;
  default: return DL_ERR(DL_EINVAL, "reduce: dtype %d", dtype);
  }
  return DL_OK;
}
