"""A PyTorch twin of attnscale's char LM (`attnscale.models.Transformer`, scaling
`standard`), for `benchmarks/train_throughput.py` only.

Same architecture as attnscale's GPT (nanoGPT's): learned positions, pre-LN
blocks with bias-free LayerNorm, tanh-GELU MLP, no biases, tied input/output
embeddings, init N(0, 0.02) with the residual projections at 0.02 / sqrt(2 L);
attention through `F.scaled_dot_product_attention(is_causal=True)`. Same
optimizer: AdamW (decay on matrices and embeddings only) with global-norm
clipping. torch is a benchmark-only dependency (`pip install torch`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):

  def __init__(self, width: int, num_heads: int, num_layers: int, mlp_ratio: int = 4):
    super().__init__()
    self.num_heads = num_heads
    self.ln1 = nn.LayerNorm(width, bias=False)
    self.qkv = nn.Linear(width, 3 * width, bias=False)
    self.out_proj = nn.Linear(width, width, bias=False)
    self.ln2 = nn.LayerNorm(width, bias=False)
    self.up = nn.Linear(width, mlp_ratio * width, bias=False)
    self.down = nn.Linear(mlp_ratio * width, width, bias=False)
    for w in (self.qkv.weight, self.up.weight):
      nn.init.normal_(w, std=0.02)
    for w in (self.out_proj.weight, self.down.weight):
      nn.init.normal_(w, std=0.02 / math.sqrt(2 * num_layers))

  def forward(self, x_BTD):
    B, T, D = x_BTD.shape
    q, k, v = self.qkv(self.ln1(x_BTD)).split(D, dim=2)
    heads = lambda t: t.view(B, T, self.num_heads, D // self.num_heads).transpose(1, 2)
    z_BNTH = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
    x_BTD = x_BTD + self.out_proj(z_BNTH.transpose(1, 2).reshape(B, T, D))
    return x_BTD + self.down(F.gelu(self.up(self.ln2(x_BTD)), approximate="tanh"))


class GPT(nn.Module):

  def __init__(self, vocab_size: int, block_size: int, num_layers: int, num_heads: int,
               width: int):
    super().__init__()
    self.embed = nn.Embedding(vocab_size, width)
    self.pos_embed = nn.Parameter(torch.randn(block_size, width) * 0.02)
    nn.init.normal_(self.embed.weight, std=0.02)
    self.blocks = nn.ModuleList(Block(width, num_heads, num_layers) for _ in range(num_layers))
    self.ln_f = nn.LayerNorm(width, bias=False)

  def forward(self, tokens_BT):
    T = tokens_BT.shape[1]
    x_BTD = self.embed(tokens_BT) + self.pos_embed[:T]
    for block in self.blocks:
      x_BTD = block(x_BTD)
    return self.ln_f(x_BTD) @ self.embed.weight.T  # tied output embedding


def make_train_step(model: GPT, *, learning_rate: float, weight_decay: float, b1: float,
                    b2: float, grad_clip: float, compile: bool = False):
  """A function (inputs, targets) -> loss that takes one optimizer step."""
  decay = [p for p in model.parameters() if p.dim() >= 2]
  no_decay = [p for p in model.parameters() if p.dim() < 2]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=learning_rate, betas=(b1, b2))
  forward = torch.compile(model) if compile else model

  def step(inputs_BT, targets_BT):
    logits_BTV = forward(inputs_BT)
    loss = F.cross_entropy(logits_BTV.view(-1, logits_BTV.shape[-1]), targets_BT.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
      torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss

  return step
