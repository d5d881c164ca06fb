"""One short script for a machine with a GPU: the attention functions, flash
attention's backward pass, the Triton kernel (chapter 16), both KV caches, the measuring helpers and the
explorers on CUDA (or another device), checked against PyTorch and the CPU.

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
import attnbook.triton_attention  # noqa: E402  (imports Triton only when a kernel runs)
from attnbook import (  # noqa: E402
    KVCache,
    MultiHeadAttention,
    StaticKVCache,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)

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
    for make in (KVCache, lambda: StaticKVCache(12)):
        torch.manual_seed(0)
        m = MultiHeadAttention(64, 4, num_kv_heads=2).to(dev).eval()
        x = torch.randn(1, 12, 64, device=dev)
        full, _ = m(x, mask=causal_mask(12, device=dev))
        cache = make()
        steps = [m(x[:, :4], mask=causal_mask(4, device=dev), cache=cache)[0]]
        steps += [m(x[:, t:t + 1], cache=cache)[0] for t in range(4, 12)]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
        assert cache.k.device.type == torch.device(dev).type


@check
def kv_caches_per_step(dev):
    """Both caches on the device: bytes written per step (measured) and time of one decoding step
    (append one token, then attend over the cache) against the cache length, GQA 32 query / 8 KV heads."""
    from attnbook.kvcache import copied_bytes_per_step
    from attnbook.measure import time_calls

    dtype = torch.float16 if dev.startswith("cuda") else torch.float32
    B, H, Hkv, D = 1, 32, 8, 128
    row = B * Hkv * D * torch.empty((), dtype=dtype).element_size()  # bytes of one token's keys (or values)
    lengths = (1024, 4096, 16384) if dev.startswith("cuda") else (256, 1024, 4096)
    concat = copied_bytes_per_step(KVCache(), 3, batch=B, num_kv_heads=Hkv, head_dim=D, prompt_len=lengths[0],
                                   dtype=dtype, device=dev)
    static = copied_bytes_per_step(StaticKVCache(lengths[0] + 3), 3, batch=B, num_kv_heads=Hkv, head_dim=D,
                                   prompt_len=lengths[0], dtype=dtype, device=dev)
    assert concat == [2 * (lengths[0] + i + 1) * row for i in range(3)], concat
    assert static == [2 * row] * 3, static
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 1, D, generator=g).to(dev, dtype)  # (B, H, 1, D) the new token's query
    new = torch.randn(B, Hkv, 1, D, generator=g).to(dev, dtype)  # (B, Hkv, 1, D) its key (and value)
    print(f"    {'S':>6s} {'concat: MiB written':>20s} {'static':>8s} {'concat: ms/step':>16s} {'static':>8s}")
    for S in lengths:
        prompt = torch.randn(B, Hkv, S - 1, D, generator=g).to(dev, dtype)  # (B, Hkv, S - 1, D)
        calls, outs = {}, {}
        for name, cache in (("concat", KVCache()), ("static", StaticKVCache(S))):
            cache.append(prompt, prompt)

            def step(cache=cache, S=S):
                cache.truncate(S - 1)  # back to S - 1 tokens: every call is the step from S - 1 to S
                k, v = cache.append(new, new)  # (B, Hkv, S, D)
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # (B, H, 1, D)

            calls[name], outs[name] = step, step()
        torch.testing.assert_close(outs["concat"], outs["static"])
        t = time_calls(calls, rounds=5, device=dev)
        written = {name: 2 * S * row if name == "concat" else 2 * row for name in calls}
        print(f"    {S:6d} {written['concat'] / 2**20:20.2f} {written['static'] / 2**20:8.4f} "
              f"{t['concat'] * 1e3:16.3f} {t['static'] * 1e3:8.3f}")


@check
def flash_backward(dev):
    """flash_attention's gradients on the device against F.scaled_dot_product_attention's (T != S, causal or
    not, sizes that are not multiples of a tile), half precision against float32, and one training step's
    time and peak memory against SDPA and the explicit path."""
    from attnbook import efficient as ef
    from attnbook.measure import cuda_peak_growth, forward_backward, time_calls, tracked_memory

    g = torch.Generator().manual_seed(0)
    for T, S, causal in ((1000, 1000, False), (1000, 1000, True), (700, 1300, True), (1300, 700, False)):
        q = torch.randn(2, 4, T, 64, generator=g).to(dev)  # (B, H, T, D)
        k, v = (torch.randn(2, 4, S, 64, generator=g).to(dev) for _ in range(2))  # (B, H, S, D)
        dout = torch.randn(2, 4, T, 64, generator=g).to(dev)
        def flash(q, k, v, causal=causal):
            return ef.flash_attention(q, k, v, causal=causal)

        def sdpa(q, k, v, causal=causal):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        got = forward_backward(flash, q, k, v, grad_out=dout)()
        want = forward_backward(sdpa, q, k, v, grad_out=dout)()
        where = f"T={T} S={S} causal={causal}"
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m, n=name, w=where: f"{n} {w}: {m}")
        for dtype in (torch.float16, torch.bfloat16):
            low = forward_backward(flash, *(t.to(dtype) for t in (q, k, v)), grad_out=dout.to(dtype))()
            for a, b in zip(low, want):
                assert a.dtype == dtype
                torch.testing.assert_close(a.float(), b, atol=5e-2, rtol=5e-2)
    T = 4096 if dev.startswith("cuda") else 2048
    q, k, v = (torch.randn(1, 4, T, 64, generator=g).to(dev) for _ in range(3))
    steps = {"explicit": forward_backward(lambda q, k, v: scaled_dot_product_attention(q, k, v)[0], q, k, v),
             "sdpa": forward_backward(F.scaled_dot_product_attention, q, k, v),
             "flash": forward_backward(ef.flash_attention, q, k, v)}
    times = time_calls(steps, rounds=3, device=dev)
    if dev.startswith("cuda"):
        peaks, how = {n: cuda_peak_growth(fn, dev) for n, fn in steps.items()}, "CUDA peak"
    else:
        peaks, how = {n: tracked_memory(fn)["peak_bytes"] for n, fn in steps.items()}, "tracked peak"
    assert peaks["flash"] <= peaks["explicit"] / 10, peaks
    print(f"    forward+backward at T={T} (B=1, H=4, D=64, float32): "
          + ", ".join(f"{n} {times[n] * 1e3:.2f} ms, {peaks[n] / 2**20:.1f} MiB" for n in steps) + f" ({how})")
    print(f"    flash / SDPA time {times['flash'] / times['sdpa']:.1f}x, flash / explicit memory "
          f"{peaks['flash'] / peaks['explicit']:.3f}")


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

    q, k, v = (x.to(dev) for x in make_inputs(2048, num_heads=4, head_dim=64))
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
    from attnbook.explorers import (
        heads_explorer,
        kv_heads_explorer,
        masks_explorer,
        positions_explorer,
        saturation_explorer,
    )
    from attnbook.explorers.masks import MASK_KINDS
    from attnbook.explorers.positions import POSITION_KINDS

    ex = kv_heads_explorer(seq_len_options=(1024, 4096), static_num_heads=(8,), static_seq_len=(1024,), rounds=2)
    assert dev in ex.control("device").values, f"kv_heads_explorer: device {dev} not offered"
    d = ex.update(num_heads=8, seq_len=4096, device=dev)
    assert all(t > 0 for t in d["time_s"]), d["time_s"]
    print(f"    kv_heads_explorer: one decoding step on {dev}, " + ", ".join(f"{t * 1e3:.3f}" for t in d["time_s"]) + " ms")
    for factory, control, values in ((saturation_explorer, "d_k", [1, 64, 1024]),
                                     (heads_explorer, "num_heads", [1, 4, 32]),
                                     (masks_explorer, "kind", MASK_KINDS[:3]),
                                     (positions_explorer, "kind", POSITION_KINDS)):
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


@check
def triton_kernel(dev):
    """attnbook.triton_attention compiled on the device (under Triton's interpreter for --device cpu): values and
    gradients against SDPA with masks, float16/bfloat16, then its time against SDPA's fused kernel."""
    import os

    if not attnbook.triton_attention.triton_available():
        raise RuntimeError(f"Triton is not installed: {attnbook.triton_attention.INSTALL}")
    if dev == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first built
    ta = attnbook.triton_attention.triton_attention
    T, S, n = (200, 150, 1024) if dev == "cuda" else (70, 45, 128)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, m, 64, generator=g).to(dev).requires_grad_() for m in (T, S, S))
    mask = (causal_mask(T, S) & padding_mask([S, S // 2])).to(dev)  # (2, 1, T, S)
    dout = torch.randn(2, 4, T, 64, generator=g).to(dev)
    ours = ta(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 5e-2)):  # check_attention's bounds; inputs rounded
        low = ta(*(t.detach().to(dtype) for t in (q, k, v)), causal=True)
        err = (low.float() - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max().item()
        assert low.dtype == dtype and err < tol, (dtype, err)
    Bc, Hc = (4, 16) if dev == "cuda" else (1, 2)  # the interpreter: seconds per call
    qc, kc, vc = (torch.randn(Bc, Hc, n, 64, generator=g).to(dev, torch.float16) for _ in range(3))
    calls = {"triton": lambda: ta(qc, kc, vc, causal=True, block_m=128 if dev == "cuda" else 32, block_n=64),
             "sdpa": lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)}
    times = attnbook.measure.time_calls(calls, rounds=10 if dev == "cuda" else 1, device=dev)
    err = (calls["triton"]() - calls["sdpa"]()).abs().max().item()
    assert err < 1e-2, err
    print(f"    causal float16 ({Bc}, {Hc}, {n}, 64): Triton {times['triton'] * 1e3:.3f} ms, SDPA {times['sdpa'] * 1e3:.3f} ms, "
          f"ratio {times['triton'] / times['sdpa']:.2f}x, max |diff| {err:.1e}")


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
