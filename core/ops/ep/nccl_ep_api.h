/*
 * nccl_ep_api.h — the part of NVIDIA's NCCL EP C API that the nccl_ep
 * backend of dl.ep.buffer calls (ep_nccl.c), declared here rather than
 * included: the library is opened at run time (ep_nccl_lib.c), so neither
 * it nor its header is needed to build. These declarations match
 * nccl/ep/include/nccl_ep.h of the nccl-extensions 0.1.0 wheel (the pinned
 * one, scripts/fetch-nccl-ep.sh): NCCL_EP 0.2.0, NCCL_EP_API_VERSION 2. Every
 * struct there starts with {size, magic} and is append-only, so a library
 * of a later API version reads these as the V2 prefix; the sizes below are
 * the header's NCCL_EP_*_V2_SIZE (V1 where there is no V2), checked at
 * build time. NCCL's own types are plain C here: ncclResult_t and
 * ncclDataType_t are ints, ncclComm_t, ncclWindow_t and cudaStream_t
 * pointers.
 */
#ifndef DISTLAB_NCCL_EP_API_H
#define DISTLAB_NCCL_EP_API_H

#include <stddef.h>
#include <stdint.h>

enum {
  NCCL_EP_API_VERSION = 2,
  NCCL_EP_MIN_VERSION_CODE = 200, /* NCCL_EP_VERSION_CODE of 0.2.0: MAJOR*10000 + MINOR*100 + PATCH */
  /* ncclDataType_t */
  NCCLX_UINT8 = 1, NCCLX_INT32 = 2, NCCLX_INT64 = 4, NCCLX_FLOAT32 = 7, NCCLX_BFLOAT16 = 9, NCCLX_FLOAT8E4M3 = 10,
  /* ncclEpAlgorithm_t */
  NCCL_EP_ALGO_LOW_LATENCY = 0, NCCL_EP_ALGO_HIGH_THROUGHPUT = 1,
  /* ncclEpLayout_t */
  NCCL_EP_LAYOUT_EXPERT_MAJOR = 1, NCCL_EP_LAYOUT_RANK_MAJOR = 2, NCCL_EP_LAYOUT_FLAT = 3,
  /* ncclEpExpertIdKind_t */
  NCCL_EP_EXPERT_ID_LOCAL = 1,
  /* ncclEpDispQuant_t */
  NCCL_EP_DISP_QUANT_NONE = 0, NCCL_EP_DISP_QUANT_DS_FP8E3M4 = 2,
};
#define NCCL_EP_MAGIC 0xC00FFFEEu
#define NCCL_EP_TENSOR_MAGIC 0xCAFECAFEu

typedef struct {
  unsigned int size, magic; /* sizeof, NCCL_EP_TENSOR_MAGIC */
  unsigned int ndim;
  int datatype;
  void *data;
  void *win_hdl; /* ncclWindow_t; NULL: a plain device pointer */
  uint64_t win_offset;
  size_t *sizes; /* ndim extents, the caller's */
} ncclEpTensor_t;

typedef int (*ncclEpAllocFn_t)(void **ptr, size_t size, void *context); /* returns cudaError_t */
typedef int (*ncclEpFreeFn_t)(void *ptr, void *context);

typedef struct {
  unsigned int size, magic, version;
  int algorithm;
  unsigned int num_experts;
  unsigned int max_dispatch_tokens_per_rank;
  unsigned int max_recv_tokens_per_rank; /* HT: recv slots; LL: unused (0) */
  unsigned int max_token_bytes;          /* dispatch and combine row bytes, at most */
  unsigned long rdma_buffer_size;        /* 0: sized by the library at handle creation */
  unsigned int num_qp_per_rank, num_channels;
  unsigned int max_num_sms;              /* 0: the algorithm's default */
  struct {
    ncclEpAllocFn_t alloc_fn;
    ncclEpFreeFn_t free_fn;
    void *context;
  } alloc;
  unsigned int enable_mask; /* LL: a peer past the timeout is masked and reported, not trapped */
  uint64_t timeout_ns;      /* GPU waits; 0: ~100 s */
  int zero_copy, overflow_policy;
  unsigned int num_topk;
  unsigned char padding_v2[4];
} ncclEpGroupConfig_t;

typedef struct {
  unsigned int size, magic;
  ncclEpTensor_t *expert_counters, *src_rank_counters, *expert_offsets, *recv_total_counter;
  int recv_topk_idx_kind;
  unsigned char padding_v2[4];
} ncclEpLayoutInfo_t;

typedef struct {
  unsigned int size, magic;
  ncclEpTensor_t *tokens, *topk_weights, *scales;
} ncclEpDispatchInputs_t;

typedef struct {
  unsigned int size, magic;
  ncclEpTensor_t *tokens, *topk_weights, *scales, *topk_idx;
} ncclEpDispatchOutputs_t;

typedef struct {
  unsigned int size, magic;
  ncclEpTensor_t *tokens, *topk_weights, *scales;
} ncclEpCombineInputs_t;

typedef struct {
  unsigned int size, magic;
  ncclEpTensor_t *tokens, *topk_weights;
} ncclEpCombineOutputs_t;

typedef struct {
  unsigned int size, magic;
  size_t dispatch_output_per_expert_alignment; /* HT expert-major; 0/1: none */
} ncclEpHandleConfig_t;

typedef struct {
  unsigned int size, magic;
  unsigned int send_only; /* LL: finish with ncclEpComplete */
  unsigned int round_scales;
  int pass_direction;
  int quant_recipe;
} ncclEpDispatchConfig_t;

typedef struct {
  unsigned int size, magic;
  unsigned int send_only;
  int pass_direction;
  int quant_recipe;
} ncclEpCombineConfig_t;

_Static_assert(sizeof(ncclEpTensor_t) == 48, "NCCL_EP_TENSOR_V1_SIZE");
_Static_assert(sizeof(ncclEpGroupConfig_t) == 112, "NCCL_EP_GROUP_CONFIG_V2_SIZE");
_Static_assert(offsetof(ncclEpGroupConfig_t, zero_copy) == 96, "NCCL_EP_GROUP_CONFIG_V1_SIZE");
_Static_assert(sizeof(ncclEpLayoutInfo_t) == 48, "NCCL_EP_LAYOUT_INFO_V2_SIZE");
_Static_assert(sizeof(ncclEpDispatchInputs_t) == 32, "NCCL_EP_DISPATCH_INPUTS_V1_SIZE");
_Static_assert(sizeof(ncclEpDispatchOutputs_t) == 40, "NCCL_EP_DISPATCH_OUTPUTS_V1_SIZE");
_Static_assert(sizeof(ncclEpCombineInputs_t) == 32, "NCCL_EP_COMBINE_INPUTS_V2_SIZE");
_Static_assert(sizeof(ncclEpCombineOutputs_t) == 24, "NCCL_EP_COMBINE_OUTPUTS_V1_SIZE");
_Static_assert(sizeof(ncclEpHandleConfig_t) == 16, "NCCL_EP_HANDLE_CONFIG_V1_SIZE");
_Static_assert(sizeof(ncclEpDispatchConfig_t) == 24, "NCCL_EP_DISPATCH_CONFIG_V2_SIZE");
_Static_assert(sizeof(ncclEpCombineConfig_t) == 20, "NCCL_EP_COMBINE_CONFIG_V2_SIZE");

typedef void *ncclEpGroup_t;
typedef void *ncclEpHandle_t;

/* The library's functions (ep_nccl_lib.c fills this table once) and the
 * two of NCCL that its messages need. */
typedef struct dl_nccl_ep_api {
  int (*GetVersion)(int *version);
  int (*CreateGroup)(ncclEpGroup_t *group, void *comm, const ncclEpGroupConfig_t *config);
  int (*GroupDestroy)(ncclEpGroup_t group);
  int (*HandleMemSize)(ncclEpGroup_t group, int layout, const ncclEpHandleConfig_t *config, size_t *size,
                       int num_topk);
  int (*InitHandle)(ncclEpHandle_t *handle, ncclEpGroup_t group, int layout, const ncclEpHandleConfig_t *config,
                    int num_topk, const ncclEpTensor_t *handle_mem);
  int (*UpdateHandle)(ncclEpHandle_t handle, const ncclEpTensor_t *topk_idx, const ncclEpLayoutInfo_t *info,
                      void *stream);
  int (*HandleDestroy)(ncclEpHandle_t handle);
  int (*Dispatch)(ncclEpHandle_t handle, const ncclEpDispatchInputs_t *in, const ncclEpDispatchOutputs_t *out,
                  const ncclEpLayoutInfo_t *info, const ncclEpDispatchConfig_t *config, void *stream);
  int (*Combine)(ncclEpHandle_t handle, const ncclEpCombineInputs_t *in, const ncclEpCombineOutputs_t *out,
                 const ncclEpCombineConfig_t *config, void *stream);
  int (*Complete)(ncclEpHandle_t handle, const void *config, void *stream);
  int (*GetAsyncError)(ncclEpGroup_t group, int *error);
  const char *(*NcclErrorString)(int result);
  int version;      /* NCCL EP's NCCL_EP_VERSION_CODE */
  int nccl_version; /* of the libnccl.so.2 this process runs (ncclGetVersion) */
  char path[512];   /* the libnccl_ep.so opened */
} dl_nccl_ep_api_t;

/* The library, opened once per process (ep_nccl_lib.c): *api or an error
 * naming what is missing (the library, a symbol, an NCCL new enough) and
 * how to get it. Only once an NCCL communicator exists (its NCCL is the one
 * NCCL EP must bind to). */
int dl_nccl_ep_load(const dl_nccl_ep_api_t **api);

#endif
