"""A SwiGLU MLP, down(silu(gate(x)) · up(x)), whose three linears carry fused adapters, as one
autograd function. Against three `FusedLoRALinear`s:
- the gate and up updates are added inside the activation (`swiglu_low_rank`), so the two
  widest outputs are written once by their GEMMs and never read back to add an update;
- gate and up read x once for their adapters, and their input gradients accumulate into one
  output (as `SharedInputLoRA`);
- the activation is not kept for backward but made again from what is (gate, up, rank-r).
`LoRALinear`'s plain expressions are the reference it is tested against."""

import torch

from tuneforge.peft.fused_lora import matmul_add_low_rank
from tuneforge.peft.shared_input_lora import matmul_sum
from tuneforge.peft.swiglu_low_rank import swiglu_low_rank, swiglu_low_rank_backward


class LoRASwiGLUMLP(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, rows, scalings, W_gate, W_up, W_down, A_gate, A_up, A_down, B_gate, B_up, B_down
    ):
        """`rows` [N, dim]; weights as `nn.Linear` holds them; `scalings` (gate, up, down)."""
        dtype = rows.dtype
        gate_rank = A_gate.shape[0]
        A = torch.cat([A_gate.to(dtype), A_up.to(dtype)])
        low = rows @ A.t()
        gate_B = (B_gate.float() * scalings[0]).to(dtype)
        up_B = (B_up.float() * scalings[1]).to(dtype)
        gate, up = rows @ W_gate.t(), rows @ W_up.t()
        low_gate, low_up = low[:, :gate_rank], low[:, gate_rank:]
        h = swiglu_low_rank(gate, up, low_gate, low_up, gate_B, up_B)
        A_d, B_d = A_down.to(dtype), B_down.to(dtype)
        low_down = h @ A_d.t()
        y = matmul_add_low_rank(h, W_down.t(), low_down, B_d.t(), scalings[2])
        ctx.save_for_backward(
            rows, gate, up, low, low_down, W_gate, W_up, W_down, A, A_d, B_d, gate_B, up_B
        )
        ctx.scalings = scalings
        ctx.adapter_dtypes = (A_gate.dtype, A_up.dtype, A_down.dtype)
        return y

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        rows, gate, up, low, low_down, W_gate, W_up, W_down, A, A_d, B_d, gate_B, up_B = saved
        s_gate, s_up, s_down = ctx.scalings
        gate_dtype, up_dtype, down_dtype = ctx.adapter_dtypes
        gate_rank = gate_B.shape[1]
        low_gate, low_up = low[:, :gate_rank], low[:, gate_rank:]
        h = swiglu_low_rank(gate, up, low_gate, low_up, gate_B, up_B)
        grad_low_down = (grad @ B_d).mul_(s_down)
        dA_down = (grad_low_down.t() @ h).to(down_dtype)
        dB_down = (grad.t() @ low_down).mul_(s_down).to(down_dtype)
        grad_h = matmul_add_low_rank(grad, W_down, grad_low_down, A_d, 1.0)
        del h
        grad_gate, grad_up = swiglu_low_rank_backward(
            grad_h, gate, up, low_gate, low_up, gate_B, up_B
        )
        grad_low = torch.cat([grad_gate @ gate_B, grad_up @ up_B], dim=1)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = matmul_sum([grad_gate, grad_up, grad_low], [W_gate, W_up, A])
        dA = grad_low.t() @ rows
        dB_gate = (grad_gate.t() @ low_gate).mul_(s_gate).to(gate_dtype)
        dB_up = (grad_up.t() @ low_up).mul_(s_up).to(up_dtype)
        dA_gate, dA_up = dA[:gate_rank].to(gate_dtype), dA[gate_rank:].to(up_dtype)
        return dx, None, None, None, None, dA_gate, dA_up, dA_down, dB_gate, dB_up, dB_down
