"""FlashAttention-4's sm90 forward compiled for sm_90a on a machine without a GPU or torch (sass.sh fa4).

The CuTe DSL compiles from fake tensors (cute.runtime.make_fake_compact_tensor) with CUTE_DSL_ARCH=sm_90a and
CUTE_DSL_KEEP=cubin; flash_attn.cute's package __init__ (its torch interface) and quack's are skipped, and a
mock stands in for torch, which the kernel modules import for type maps only. The kernel's arguments are
those of flash_attn.cute.interface's sm90 path for a dense bshd call: no varlen, no paging, no masks but
causal, no score_mod, the tile of _tile_size_fwd_sm90. D and CAUSAL from the environment.
"""
import os
import sys
import types
from unittest import mock

for name in ("torch", "torch._subclasses", "torch._subclasses.fake_tensor", "tvm_ffi"):
    sys.modules[name] = mock.MagicMock(name=name)
site = next(p for p in sys.path if p.endswith("site-packages"))
for pkg, path in (("flash_attn", "flash_attn"), ("flash_attn.cute", "flash_attn/cute"), ("quack", "quack")):
    mod = types.ModuleType(pkg)
    mod.__path__ = [os.path.join(site, path)]
    sys.modules[pkg] = mod

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream  # noqa: E402
from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90  # noqa: E402
from flash_attn.cute.utils import AuxData  # noqa: E402

d = int(os.environ["D"])
causal = os.environ["CAUSAL"] == "1"
tile_m, tile_n = (128, 128) if d == 128 else (192, 128)  # _tile_size_fwd_sm90 (RS, intra-warpgroup overlap)
kernel = FlashAttentionForwardSm90(
    cutlass.BFloat16, d, d, 1, is_causal=causal, is_local=False, pack_gqa=False, tile_m=tile_m, tile_n=tile_n,
    num_stages=2, num_threads=128 * (tile_m // 64 + 1), Q_in_regs=False, intra_wg_overlap=True,
    mma_pv_is_rs=True, mask_mod=None, score_mod=None, has_aux_tensors=False, q_subtile_factor=None,
    paged_kv_non_tma=False)
b, s, h = cute.sym_int(), cute.sym_int(), cute.sym_int()


def bshd():
    return make_fake_compact_tensor(cutlass.BFloat16, (b, s, h, d), stride_order=(3, 2, 1, 0), assumed_align=16)


lse = make_fake_compact_tensor(cutlass.Float32, (b, h, s), stride_order=(2, 1, 0), assumed_align=4)
# q, k, v, out, lse, scale; cu_seqlens q/k, seqused q/k, page table, windows, sink, block sparsity: none
cute.compile(kernel, bshd(), bshd(), bshd(), bshd(), lse, d ** -0.5, None, None, None, None, None, None, None,
             None, None, AuxData(None, None), None, None, make_fake_stream(), options="--keep-cubin")
print(f"fa4 sm90 forward d {d} causal {int(causal)}: compiled", file=sys.stderr)
