// ep_layouts.cuh — the EP buffer layouts, each a policy type the kernels
// (ep_dispatch.cu, ep_combine.cu) are instantiated with, as NCCL's
// algorithms are specializations over shared primitives. A layout
// (ep_per_expert.cuh, ep_per_rank.cuh) gives:
//   id                    its DL_EP_* value (distlab.h)
//   has_lamport           Lamport-slot variants exist (where a.lamport)
//   direct<EM>            the send writes this rank's own rows into the outputs
//   send_output<EM>       the EXPERT_MAJOR its send kernel is instantiated with
//                         (a send that does not depend on the output: one kernel)
//   sends, dispatch_slot, header_word   where the send's messages go, and what they say
//   dispatch_recv<FP8, EM>, dispatch_recv_lamport   its receives
//   combine_slot(k, e)    the combine slot of a token's selection k, expert e
// A third layout: a policy file, its entry in ep_layouts below, its twin
// (kernels/ep/cpu/ep.c), its sizes (ep.h) and its DL_EP_* value.
#ifndef DISTLAB_EP_LAYOUTS_CUH
#define DISTLAB_EP_LAYOUTS_CUH

#include "ep/ep_per_expert.cuh"
#include "ep/ep_per_rank.cuh"

template <class... Ls> struct ep_layout_list {};
using ep_layouts = ep_layout_list<ep_per_expert, ep_per_rank>;

// of.template operator()<L>() for the layout L of a->layout (nullptr for none).
template <class F, class... Ls> ep_kernel_t ep_pick_layout(const dl_ep_args_t *a, ep_layout_list<Ls...>, F of) {
  ep_kernel_t k = nullptr;
  ((a->layout == Ls::id ? (void)(k = of.template operator()<Ls>()) : (void)0), ...);
  return k;
}

#endif
