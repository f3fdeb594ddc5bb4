"""FlashAttention-4's sm90 backward compiled for sm_90a on a machine without a GPU or torch (sass.sh fa4bwd).

As fa4_compile.py does for the forward: the CuTe DSL compiles from fake tensors with CUTE_DSL_ARCH=sm_90a and
CUTE_DSL_KEEP=cubin, torch mocked. The kernel's arguments are those of flash_attn.cute.interface's sm90 backward
for a dense bshd call, MHA (no dK/dV postprocess): its _tile_size_bwd_sm90 config (d 128: 80 x 128 without a
mask, 64 x 128 causal; d 64: 128 x 128), q/k/v/dO/dK/dV bshd bf16, lse log2 and dPsum [b, h, s rounded] and
the dQ accumulator [b, h, s rounded * d] in fp32.

Two places of quack 0.6.5's copy_utils.py do not trace with the DSL here (as on the CPU machine; the same
versions run on the GPU hosts, through a path we do not take): copy_fn indexes a partition with an Ellipsis
(`t[..., i]`, which the DSL's coordinate check refuses) and cvt_copy (and its predicated twin) call `.to` on a
register tensor (which has none in DSL 4.8.1). This script copies quack into QUACK_DIR and rewrites those lines to the DSL's spelled-out
forms (every mode but the last None; load, convert, store into a fragment), asserting that each applies. The
SASS is FA4's but for those two copies (the conversion's F2FP and the stores' addresses).
"""
import os
import shutil
import sys
import types
from unittest import mock

for name in ("torch", "torch._subclasses", "torch._subclasses.fake_tensor", "tvm_ffi"):
    sys.modules[name] = mock.MagicMock(name=name)
site = next(p for p in sys.path if p.endswith("site-packages"))
quack_dir = os.environ["QUACK_DIR"]
shutil.rmtree(quack_dir, ignore_errors=True)
shutil.copytree(os.path.join(site, "quack"), quack_dir)
cu = os.path.join(quack_dir, "copy_utils.py")
src = open(cu).read()
for old, new in (
    ("tRS_sC[..., dst_idx]", "tRS_sC[(None,) * (cute.rank(tRS_sC) - 1) + (dst_idx,)]"),
    ("        src = src.to(dst.element_type, loc=loc, ip=ip)\n",
     "        cvt = cute.make_fragment_like(src, dst.element_type)\n"
     "        cvt.store(src.load().to(dst.element_type))\n"
     "        src = cvt\n"),
):
    assert src.count(old) >= 1, f"quack's copy_utils.py: {old.strip()!r} not found (another quack version?)"
    src = src.replace(old, new)
open(cu, "w").write(src)
for pkg, path in (("flash_attn", os.path.join(site, "flash_attn")), ("flash_attn.cute", os.path.join(site, "flash_attn/cute")),
                  ("quack", quack_dir)):
    mod = types.ModuleType(pkg)
    mod.__path__ = [path]
    sys.modules[pkg] = mod

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream  # noqa: E402
from flash_attn.cute.flash_bwd_sm90 import FlashAttentionBackwardSm90  # noqa: E402
from flash_attn.cute.utils import AuxData  # noqa: E402

d = int(os.environ["D"])
causal = os.environ["CAUSAL"] == "1"
if d == 128:  # _tile_size_bwd_sm90
    tile_m, sdp_swap, dq_swap, atom_dq = (64 if causal else 80), True, not causal, 1
else:
    tile_m, sdp_swap, dq_swap, atom_dq = 128, True, False, 2
kernel = FlashAttentionBackwardSm90(
    cutlass.BFloat16, d, d, 1, causal, is_local=False, deterministic=False, tile_m=tile_m, tile_n=128, Q_stage=2,
    dO_stage=2, PdS_stage=2, SdP_swapAB=sdp_swap, dKV_swapAB=False, dQ_swapAB=dq_swap, AtomLayoutMSdP=1,
    AtomLayoutNdKV=2, AtomLayoutMdQ=atom_dq, num_threads=384, V_in_regs=False, score_mod=None,
    score_mod_bwd=None, mask_mod=None, has_aux_tensors=False, q_subtile_factor=None, dQ_single_wg=False)
b, s, h, sr, sd = (cute.sym_int() for _ in range(5))


def bshd():
    return make_fake_compact_tensor(cutlass.BFloat16, (b, s, h, d), stride_order=(3, 2, 1, 0), assumed_align=16)


def f32(shape):
    return make_fake_compact_tensor(cutlass.Float32, shape, stride_order=(2, 1, 0), assumed_align=16)


# q, k, v, dO, lse log2, dPsum, dQ accumulator, dK, dV, scale; cu_seqlens q/k, seqused q/k, windows, the three
# semaphores: none; aux data; block sparsity, cu_total_m_blocks: none
cute.compile(kernel, bshd(), bshd(), bshd(), bshd(), f32((b, h, sr)), f32((b, h, sr)), f32((b, h, sd)), bshd(), bshd(),
             d ** -0.5, None, None, None, None, None, None, None, None, None, AuxData(None, None), None, None,
             make_fake_stream(), options="--keep-cubin")
print(f"fa4 sm90 backward d {d} causal {int(causal)}: compiled (tile {tile_m} x 128)", file=sys.stderr)
