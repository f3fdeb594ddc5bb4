/*
 * softmax.c — CPU twin of kernels/tensor/softmax.cu: softmax or log_softmax
 * of every row (the elements along dim) of a strided view, in fp64: the
 * row's max, then the sum of exp(x - max), then each output once. The
 * reference the GPU specs compare with.
 */
#include <math.h>

#include "tensor/cpu/rows.h"
#include "tensor/tensor_math.h"


int dl_softmax_cpu(const dl_view_t *out, const dl_view_t *x, int dim, int log_out, void *stream) {
  (void)stream;
  int64_t n = x->shape[dim], rows = n ? x->numel / n : 0, sx = x->strides[dim], so = out->strides[dim];
  for (int64_t r = 0; r < rows; r++) {
    int64_t bx = dl_row_base_cpu(x, dim, r), bo = dl_row_base_cpu(out, dim, r);
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; j++) {
      double v = dl_load_f64(x->data, bx + j * sx, x->dtype);
      if (v > m || v != v) m = v;
      if (m != m) break;
    }
    for (int64_t j = 0; j < n; j++) sum += exp(dl_load_f64(x->data, bx + j * sx, x->dtype) - m);
    double lsum = log(sum);
    for (int64_t j = 0; j < n; j++) {
      double d = dl_load_f64(x->data, bx + j * sx, x->dtype) - m;
      dl_store_f64(out->data, bo + j * so, out->dtype, log_out ? d - lsum : exp(d) / sum);
    }
  }
  return DL_OK;
}
