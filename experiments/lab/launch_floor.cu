// launch_floor.cu — what one kernel launch costs the host on this machine,
// with no Lua and no distlab in the way: the floor under experiments/foundation/overhead.lua.
// Each variant is issued in batches of 256 with a synchronize between batches;
// the median issue time per launch is printed in microseconds.
//   nvcc -O2 -arch=sm_90 experiments/lab/launch_floor.cu -o /tmp/launch_floor && /tmp/launch_floor
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e = (x);                                                                 \
    if (e != cudaSuccess) {                                                              \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                                     \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

struct big_t {
  int ndim, contiguous;
  long long shape[8], strides[8];
};

__global__ void empty_kernel() {}
__global__ void fill_small_kernel(float *p, long long n, float v) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
__global__ void fill_big_kernel(float *p, big_t s, long long n, float v) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) p[i * s.strides[0]] = v;
}

static double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

template <typename F> static double per_call(F f) {
  for (int i = 0; i < 2000; i++) f();
  CK(cudaDeviceSynchronize());
  std::vector<double> v;
  for (int b = 0; b < 200; b++) {
    double t0 = now_us();
    for (int i = 0; i < 256; i++) f();
    v.push_back((now_us() - t0) / 256);
    CK(cudaDeviceSynchronize());
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  float *p;
  CK(cudaMalloc(&p, 1024));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  big_t s = {};
  s.ndim = 1;
  s.strides[0] = 1;
  long long n = 1;
  float v = 1;
  printf("launch floor on %s\n", prop.name);
  printf("%-44s %8.3f us\n", "empty_kernel<<<1,1>>>()", per_call([&] { empty_kernel<<<1, 1>>>(); }));
  printf("%-44s %8.3f us\n", "fill (ptr, n, v) <<<>>>",
         per_call([&] { fill_small_kernel<<<1, 256>>>(p, n, v); }));
  printf("%-44s %8.3f us\n", "fill (ptr, 136-byte struct, n, v) <<<>>>",
         per_call([&] { fill_big_kernel<<<1, 256>>>(p, s, n, v); }));
  void *args[] = {&p, &n, &v};
  printf("%-44s %8.3f us\n", "fill via cudaLaunchKernel", per_call([&] {
           cudaLaunchKernel((const void *)fill_small_kernel, dim3(1), dim3(256), args, 0, 0);
         }));
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000, cudaEnableDefault, &q));
  auto cuLaunch = (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, CUstream, void **, void **))fn;
  cudaFunction_t f;
  CK(cudaGetFuncBySymbol(&f, (const void *)fill_small_kernel));
  printf("%-44s %8.3f us\n", "fill via cuLaunchKernel (driver entry point)",
         per_call([&] { cuLaunch((CUfunction)f, 1, 1, 1, 256, 1, 1, 0, 0, args, nullptr); }));
  printf("%-44s %8.3f us\n", "cudaMemsetAsync 4 bytes", per_call([&] { cudaMemsetAsync(p, 0, 4, 0); }));
  CK(cudaGetLastError());
  return 0;
}
