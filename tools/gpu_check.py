"""One short script for a machine with a GPU: the attention functions, the
measuring helpers and the explorers on CUDA (or another device), checked
against PyTorch and the CPU.

    .venv/bin/python tools/gpu_check.py            # cuda (fails if there is none)
    .venv/bin/python tools/gpu_check.py --device cpu   # the same checks on the CPU (a dry run)

Prints one line per check and a final 'N passed, N failed' line; exits non-zero on a failure.
"""

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attnbook  # noqa: E402
from attnbook import KVCache, MultiHeadAttention, causal_mask, padding_mask, scaled_dot_product_attention  # noqa: E402

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


@check
def sdpa_matches_torch(dev):
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 4, 64, 32, generator=g).to(dev, dtype) for _ in range(3))
        mask = (causal_mask(64) & padding_mask([64, 40])).to(dev)
        out, w = scaled_dot_product_attention(q, k, v, mask)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.isfinite(out).all() and torch.isfinite(w).all(), dtype
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    blocked = torch.zeros(8, 8, dtype=torch.bool, device=dev)
    out, w = scaled_dot_product_attention(q, k[..., :8, :], v[..., :8, :], blocked[:1].expand(64, 8))
    assert (out == 0).all() and (w == 0).all()


@check
def mha_paths_and_gqa(dev):
    for kv in (8, 2, 1):
        torch.manual_seed(0)
        m = MultiHeadAttention(256, 8, num_kv_heads=kv).to(dev).eval()
        x = torch.randn(2, 50, 256, device=dev)
        slow, _ = m(x, mask=causal_mask(50, device=dev))
        fast, _ = m(x, mask=causal_mask(50, device=dev), need_weights=False)
        torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)
        cpu = MultiHeadAttention(256, 8, num_kv_heads=kv)
        cpu.load_state_dict({k_: t.cpu() for k_, t in m.state_dict().items()})
        torch.testing.assert_close(cpu(x.cpu(), mask=causal_mask(50))[0], slow.cpu(), atol=1e-4, rtol=1e-4)


@check
def kv_cache_decoding(dev):
    torch.manual_seed(0)
    m = MultiHeadAttention(64, 4, num_kv_heads=2).to(dev).eval()
    x = torch.randn(1, 12, 64, device=dev)
    full, _ = m(x, mask=causal_mask(12, device=dev))
    cache = KVCache()
    steps = [m(x[:, :4], mask=causal_mask(4, device=dev), cache=cache)[0]]
    steps += [m(x[:, t:t + 1], cache=cache)[0] for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


@check
def efficient_variants(dev):
    from attnbook import efficient as ef

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 512, 32, generator=g).to(dev) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(ef.flash_attention(q, k, v, block_size=128), ref, atol=1e-4, rtol=1e-4)
    win = attnbook.sliding_window_mask(512, 16, device=dev)
    torch.testing.assert_close(ef.sliding_window_attention(q, k, v, 16),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=win), atol=1e-4, rtol=1e-4)
    lin = ef.linear_attention(q, k, v, causal=True)
    torch.testing.assert_close(lin, ef.linear_attention_quadratic(q, k, v, causal=True), atol=1e-4, rtol=1e-4)


@check
def measuring_on_the_device(dev):
    from attnbook.efficient import attention_call, make_inputs
    from attnbook.measure import cuda_peak_growth, time_calls

    q, k, v = (x.to(dev) for x in make_inputs(2048, H=4, D=64))
    calls = {name: attention_call(name, q, k, v, 128) for name in ("exact", "pytorch", "flash")}
    times = time_calls(calls, rounds=3, device=dev)  # synchronised: the device's work, not the launch
    assert all(t > 0 for t in times.values()), times
    print("    " + ", ".join(f"{n} {t * 1e3:.2f} ms" for n, t in times.items()))
    if dev.startswith("cuda"):
        peaks = {name: cuda_peak_growth(fn, dev) for name, fn in calls.items()}
        table = 4 * 2048 * 2048 * 4  # one (B=1, H=4, T, T) float32 table
        assert peaks["exact"] >= table > peaks["flash"], peaks
        print("    peak CUDA memory: " + ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in peaks.items()))


@check
def explorers_on_the_device(dev):
    from attnbook.explorers import gqa, heads, masks, positions, saturation

    ex = gqa.gqa_explorer(seq_lens=(1024, 4096), static_heads=(8,), static_seq=(1024,), rounds=2)
    assert dev in ex.control("device").values, f"gqa_explorer: device {dev} not offered"
    d = ex.update(num_heads=8, seq_len=4096, device=dev)
    assert all(t > 0 for t in d["time_s"]), d["time_s"]
    print(f"    gqa_explorer: one decoding step on {dev}, " + ", ".join(f"{t * 1e3:.3f}" for t in d["time_s"]) + " ms")
    for factory, control, values in ((saturation.saturation_explorer, "d_k", [1, 64, 1024]),
                                     (heads.heads_explorer, "num_heads", [1, 4, 32]),
                                     (masks.masks_explorer, "kind", masks.MASK_KINDS[:3]),
                                     (positions.positions_explorer, "kind", positions.POSITION_KINDS)):
        ex = factory()
        devices = ex.control("device").values
        assert dev in devices, f"{factory.__name__}: device {dev} not offered ({devices})"
        times = []
        for value in values:
            t = time.perf_counter()
            on_dev = ex.update(device=dev, **{control: value})
            times.append(time.perf_counter() - t)
            on_cpu = ex.compute(**{**ex.values, "device": "cpu"})
            for key in ("entropy", "weights", "similarity"):
                if key in on_dev:
                    a, b = torch.as_tensor(on_dev[key]), torch.as_tensor(on_cpu[key])
                    torch.testing.assert_close(a.double(), b.double(), atol=1e-3, rtol=1e-3)
        print(f"    {factory.__name__}: slowest update on {dev} {max(times) * 1e3:.0f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    dev = ap.parse_args().device
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run with --device cpu for a dry run")
    print(f"torch {torch.__version__}, device {dev}"
          + (f" ({torch.cuda.get_device_name(0)})" if dev == "cuda" else ""))
    passed = failed = 0
    for fn in CHECKS:
        try:
            fn(dev)
            passed += 1
            print(f"ok    {fn.__name__}")
        except Exception:
            failed += 1
            print(f"FAIL  {fn.__name__}\n{traceback.format_exc()}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
