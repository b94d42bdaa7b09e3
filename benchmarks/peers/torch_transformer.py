"""Peer reference: one training step of a small decoder-only character LM in PyTorch, timed.

The twin of ``benchmarks/model_step.py --model transformer`` (mpcore): token + position
embeddings (``--vocab``, ``--seq-len``, ``--d-model``), ``--layers`` pre-LN blocks (LayerNorm,
causal multi-head self-attention with ``--heads`` heads of key_dim d_model/heads and biased
q/k/v/output projections as Keras' MultiHeadAttention, residual; LayerNorm, Dense 4*d_model
GELU (erf, Keras' default), Dense d_model, residual), a final LayerNorm and Dense(vocab) logits;
softmax cross-entropy in float32 over every position, Adam (Keras' epsilon 1e-7), random tokens.
LayerNorm has Keras' epsilon 1e-3; embeddings start uniform in +-0.05 and kernels Glorot-uniform
as Keras'. Attention is ``F.scaled_dot_product_attention(is_causal=True)``, what a PyTorch user
writes.

    python benchmarks/peers/torch_transformer.py --policy mixed_bfloat16 --batch 32 --threads 1

Policies: float32 -> fp32; mixed_float16 -> autocast(float16) + GradScaler; mixed_bfloat16 ->
autocast(bfloat16). Prints one JSON line. Needs torch (its own venv; never mpcore's).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling
from amp_step import POLICIES, time_steps
from torch import nn


def dense(cin: int, cout: int) -> nn.Linear:
    layer = nn.Linear(cin, cout)
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads, self.key_dim = heads, d_model // heads
        inner = heads * self.key_dim
        self.q, self.k, self.v = dense(d_model, inner), dense(d_model, inner), dense(d_model, inner)
        self.out = dense(inner, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(h: torch.Tensor) -> torch.Tensor:
            return h.view(b, t, self.heads, self.key_dim).transpose(1, 2)

        h = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                           is_causal=True)
        return self.out(h.transpose(1, 2).reshape(b, t, self.heads * self.key_dim))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model, eps=1e-3), nn.LayerNorm(d_model, eps=1e-3)
        self.attn = Attention(d_model, heads)
        self.up, self.down = dense(d_model, 4 * d_model), dense(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class CharLM(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
        for emb in (self.tokens, self.positions):
            nn.init.uniform_(emb.weight, -0.05, 0.05)
        self.blocks = nn.Sequential(*[Block(d_model, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d_model, eps=1e-3)
        self.head = dense(d_model, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.ln(self.blocks(self.tokens(ids) + self.positions(pos))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--policy", default="float32", choices=POLICIES)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=98, help="98: mp.datasets.stdlib_text's")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    a = ap.parse_args()
    if a.d_model % a.heads:
        ap.error(f"--d-model ({a.d_model}) must be a multiple of --heads ({a.heads})")
    if a.threads:
        torch.set_num_threads(a.threads)

    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = CharLM(a.vocab, a.seq_len, a.d_model, a.heads, a.layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    x = torch.randint(0, a.vocab, (a.batch, a.seq_len), device=dev)
    y = torch.randint(0, a.vocab, (a.batch, a.seq_len), device=dev)
    # softmax cross-entropy in float32 over every position
    dt, loss = time_steps(model, opt, x,
                          lambda logits: F.cross_entropy(logits.reshape(-1, a.vocab),
                                                         y.reshape(-1)),
                          a.policy, dev, a.warmup, a.steps)
    print(json.dumps({
        "peer": "torch " + torch.__version__, "model": "transformer", "device": a.device,
        "policy": a.policy, "batch": a.batch, "vocab": a.vocab, "seq_len": a.seq_len,
        "d_model": a.d_model, "heads": a.heads, "layers": a.layers,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
        "ms_per_step": round(dt * 1e3, 3), "samples_per_s": round(a.batch / dt, 1),
        "tokens_per_s": round(a.batch * a.seq_len / dt, 1), "steps": a.steps,
        "loss": round(loss, 5)}))


if __name__ == "__main__":
    main()
