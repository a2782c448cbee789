"""examples/dlrm_v3/kernels.py: DLRM-v3's jagged attention as a Triton kernel, run by Triton's
interpreter on CPU tensors (TRITON_INTERPRET=1, in a process of its own: the setting is read when
Triton is imported), equals the masked form in plain torch on layouts that cross the kernel's
blocks (requests of no history, histories and candidate lists shorter and longer than a block,
one request alone), in fp32 and fp16, with the default blocks and three other shapes of them
(the defaults before the sweep among them)
(TRITON_RUST_HSTU_BLOCKS; a malformed setting refused); and the whole network run through the kernel gives the
reference model's scores. No GPU here: its speed is not measured by this test."""
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PY = os.path.join(ROOT, ".venv", "bin", "python")
PY = PY if os.path.exists(PY) else sys.executable

SCRIPT = r"""
import sys
sys.path.insert(0, "examples")
sys.path.insert(0, "tests/tools")
import torch
from dlrm_v3 import kernels, network as net, model as dv3
from test_dlrm_v3_reference import FIXED_NORM, mixed_batch

import os
torch.manual_seed(0)
layouts = [([0, 3, 40], [3, 1, 5]), ([70, 5], [2, 40]), ([0], [1]), ([31, 32, 33, 0, 64], [1, 31, 32, 64, 2])]
# the defaults, then blocks of other shapes (the unmasked loop's end moves with them)
for cut, dtype, bound in ((None, torch.float32, 1e-6), (None, torch.float16, 2e-3),
                          ("16,32,4,2", torch.float32, 1e-6), ("64,16,4,3,exact", torch.float32, 1e-6),
                          ("32,32,4,3,exact", torch.float32, 1e-6)):
    os.environ.pop(kernels.BLOCKS_ENV, None)
    if cut:
        os.environ[kernels.BLOCKS_ENV] = cut
    print("blocks", kernels.blocks())
    for hist, cand in layouts:
        h = torch.tensor(hist)
        lengths = 1 + h + torch.tensor(cand)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lengths, 0)])
        total = int(offsets[-1])
        q, k, v = (torch.randn(total, 2, 32).to(dtype) for _ in range(3))
        norm = torch.tensor(float(1 + max(hist) + max(cand)))
        got = kernels.hstu_attention(q, k, v, offsets, h, norm, 0.17)
        want = kernels.reference(q.float(), k.float(), v.float(), offsets, h, norm, 0.17)
        err = float((got.float() - want).abs().max())
        assert got.dtype == dtype and got.shape == want.shape and err <= bound, (dtype, hist, cand, err)
        print("kernel", dtype, hist, cand, f"{err:.1e}")
os.environ.pop(kernels.BLOCKS_ENV, None)
for bad in ("32,32,4", "24,32,4,3", "32,32,4,3,quick"):
    try:
        kernels.Blocks.parse(bad)
    except ValueError as e:
        print("refused blocks:", e)
try:
    kernels.hstu_attention(torch.zeros(3, 2, 24), torch.zeros(3, 2, 24), torch.zeros(3, 2, 32),
                           torch.tensor([0, 3]), torch.tensor([1]), torch.tensor(3.0), 0.2)
except ValueError as e:
    print("refused:", e)
else:
    raise SystemExit("a width of 24 was not refused")
for norm in (None, FIXED_NORM):
    ranker = dv3.HstuRanker(dv3.Config.tiny(attn_norm_len=norm)).eval()
    batch = mixed_batch(seed=3)
    inputs = net.rows_of(ranker, batch)
    with torch.no_grad():
        got = net.HstuNetwork(ranker)(*[inputs[n] for n, _, _ in net.INPUTS])
    err = float((got - ranker.score_candidates(batch)).abs().max())
    assert err <= 1e-5, err
    print("network through the kernel, normaliser", norm, f"{err:.1e}")
"""


def test_the_kernel_under_the_interpreter_equals_the_masked_form():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([PY, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    print(out.stdout)
    assert out.stdout.count("kernel ") == 20 and out.stdout.count("refused blocks:") == 3
    assert "refused:" in out.stdout and out.stdout.count("network ") == 2
