"""Checks of ExpertParallelMoE against a single-process fp32 reference, shared by ep_check.py
(torchrun, GPUs, gmjit experts) and test_expert_parallel_cpu.py (gloo, CPU, torch experts).

Every rank builds the same layer from one seed and the same data; rank 0 rebuilds the full
layer (distributed=False, same seed), computes it in float32 from the same bf16 weights, and
compares the gathered outputs and gradients.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import reference  # noqa: E402  python/tests/reference.py

from gmjit.torch import ExpertParallelMoE  # noqa: E402

# name, hidden, ffn, experts per rank, top_k, tokens per rank, routing, bias
CASES = [
    ("balanced El=1", 64, 64, 1, 1, 48, "random", False),
    ("uneven El=2", 128, 64, 2, 2, 64, "uneven", False),
    ("rank>0 gets none El=2", 64, 128, 2, 2, 40, "rank0", False),
    ("uneven El=4 bias", 64, 64, 4, 2, 64, "uneven", True),
    ("rank>0 gets none El=4", 64, 64, 4, 3, 32, "rank0", False),
]
TOLERANCE = 3e-2  # max |a - b| / max |b|, bf16 data and weights


def steer_router(layer: ExpertParallelMoE, x_all: torch.Tensor, routing: str, rank0_experts: int) -> None:
    """Biases routing through feature 0 (set to 1 on every token)."""
    if routing == "random":
        return
    with torch.no_grad():
        x_all[:, 0] = 1.0
        w = layer.router.weight
        E = w.shape[0]
        if routing == "uneven":  # expert e gets a logit bonus 0.5 e: skewed loads
            w[:, 0] = 0.5 * torch.arange(E, dtype=torch.float32, device=w.device).to(w.dtype)
        elif routing == "rank0":  # every token to rank 0's experts; other ranks receive none
            w[:, 0] = -8.0
            w[:rank0_experts, 0] = 8.0


def _gather(t: torch.Tensor, world: int) -> torch.Tensor:
    t = t.detach().float().contiguous()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    return torch.cat(parts)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def run_case(case, device, experts, seed: int = 1234, activation: str = "swiglu"):
    """Returns, on rank 0, a list of (case, quantity, error, ok); elsewhere []."""
    name, H, Fw, El, k, T, routing, bias = case
    rank, W = dist.get_rank(), dist.get_world_size()
    E = El * W
    renorm = k > 1  # with k = 1 renormalising makes every weight 1 and the router's gradient 0
    layer = ExpertParallelMoE(H, Fw, E, k, activation=activation, bias=bias, experts=experts,
                              seed=seed, renormalize=renorm, device=device)  # fmt: skip
    g = torch.Generator().manual_seed(seed + 1)
    x_all = torch.randn(W * T, H, generator=g).to(torch.bfloat16)
    dy_all = torch.randn(W * T, H, generator=g)
    steer_router(layer, x_all, routing, El)
    x_all, dy_all = x_all.to(device), dy_all.to(device)
    x = x_all[rank * T : (rank + 1) * T].clone().requires_grad_()
    y = layer(x)
    (y.float() * dy_all[rank * T : (rank + 1) * T]).sum().backward()
    layer.allreduce_router_grad()

    received = _gather(torch.tensor([float(layer.last_tokens_received)], device=device), W)
    got = {"y": _gather(y, W), "dx": _gather(x.grad, W), "d router": layer.router.weight.grad.float()}
    for p in ("w1", "w2", "b1", "b2"):
        param = getattr(layer, p)
        if param is not None:
            got["d" + p] = _gather(param.grad, W)
    if rank != 0:
        return []

    full = ExpertParallelMoE(H, Fw, E, k, distributed=False, activation=activation, bias=bias,
                             experts="torch", seed=seed, device=device)  # fmt: skip
    steer_router(full, x_all.clone(), routing, El)
    ref = {p: _attr(full, n).detach().float().requires_grad_()
           for p, n in (("router", "router.weight"), ("w1", "w1"), ("w2", "w2"), ("b1", "b1"),
                        ("b2", "b2")) if _attr(full, n) is not None}  # fmt: skip
    xr = x_all.float().requires_grad_()
    yr = reference_moe(xr, ref["router"], ref["w1"], ref["w2"], ref.get("b1"), ref.get("b2"), k,
                       renorm, activation)  # fmt: skip
    (yr * dy_all).sum().backward()
    want = {"y": yr, "dx": xr.grad, "d router": ref["router"].grad}
    for p in ("w1", "w2", "b1", "b2"):
        if p in ref:
            want["d" + p] = ref[p].grad
    rows = []
    for q in got:
        err = _rel(got[q], want[q])
        rows.append((name, q, err, err < TOLERANCE))
    if routing == "rank0" and W > 1:
        none = bool((received[1:] == 0).all())
        rows.append((name, "ranks>0 received 0 rows", float(received[1:].sum()), none))
    return rows


def _attr(m, dotted):
    for part in dotted.split("."):
        m = getattr(m, part)
        if m is None:
            return None
    return m


def reference_moe(x, router_w, w1, w2, b1, b2, top_k, renormalize, activation):
    """Dense per-expert fp32 reference: out[t] = Σ_k p[t,k] · expert_{e[t,k]}(x[t])."""
    probs = torch.softmax(x @ router_w.T, dim=-1)
    weights, chosen = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        tok, slot = (chosen == e).nonzero(as_tuple=True)
        h = x[tok] @ w1[e].T
        if b1 is not None:
            h = h + b1[e]
        y = reference.activation(h, activation) @ w2[e].T
        if b2 is not None:
            y = y + b2[e]
        out = out.index_add(0, tok, y * weights[tok, slot, None])
    return out


def print_table(rows, title: str) -> bool:
    ok = all(r[3] for r in rows)
    print(f"\n{title}")
    print(f"{'case':<26} {'quantity':<26} {'error':>10}  result")
    for name, q, err, good in rows:
        print(f"{name:<26} {q:<26} {err:>10.3g}  {'PASS' if good else 'FAIL'}")
    print(f"overall: {'PASS' if ok else 'FAIL'}")
    return ok
