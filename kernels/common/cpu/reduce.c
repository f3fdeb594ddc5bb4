/*
 * reduce.c — the host reduction of n buffers, element-wise and in the order
 * given (so every rank that reduces the same buffers in the same order gets
 * bitwise the same result): sum, avg, max, min over every dtype; bf16/fp16
 * accumulate in fp32 and round once. The shared-memory communicator
 * (core/comm/comm_shm.c) reduces its slots with it.
 */
#include "common/dtype.h"
#include "common/reduce.h"

#define REDUCE_LOOP(T, UT)                                                                 \
  do {                                                                                     \
    T *d = dst;                                                                            \
    for (int64_t i = 0; i < k; i++) {                                                      \
      T a = ((const T *)src[0])[i];                                                        \
      for (int j = 1; j < n; j++) {                                                        \
        T b = ((const T *)src[j])[i];                                                      \
        if (red == DL_RED_MAX) a = b > a ? b : a;                                          \
        else if (red == DL_RED_MIN) a = b < a ? b : a;                                     \
        else a = (T)((UT)a + (UT)b);                                                       \
      }                                                                                    \
      d[i] = red == DL_RED_AVG ? (T)(a / (T)n) : a;                                        \
    }                                                                                      \
  } while (0)

void dl_reduce_cpu(void *dst, char *const *src, int n, int64_t k, int dtype, int red, float *acc) {
  switch (dtype) {
  case DL_F32: REDUCE_LOOP(float, float); break;
  case DL_F64: REDUCE_LOOP(double, double); break;
  case DL_I32: REDUCE_LOOP(int32_t, uint32_t); break;
  case DL_I64: REDUCE_LOOP(int64_t, uint64_t); break;
  case DL_U8: REDUCE_LOOP(uint8_t, uint8_t); break;
  default: { /* bf16, fp16: accumulate in fp32, round once */
    int bf = dtype == DL_BF16;
    for (int j = 0; j < n; j++) {
      const uint16_t *s = (const uint16_t *)src[j];
      for (int64_t i = 0; i < k; i++) {
        float b = bf ? dl_bf16_to_f32(s[i]) : dl_f16_to_f32(s[i]);
        if (j == 0) acc[i] = b;
        else if (red == DL_RED_MAX) acc[i] = b > acc[i] ? b : acc[i];
        else if (red == DL_RED_MIN) acc[i] = b < acc[i] ? b : acc[i];
        else acc[i] += b;
      }
    }
    uint16_t *d = dst;
    for (int64_t i = 0; i < k; i++) {
      float v = red == DL_RED_AVG ? acc[i] / (float)n : acc[i];
      d[i] = bf ? dl_f32_to_bf16(v) : dl_f32_to_f16(v);
    }
  }
  }
}
