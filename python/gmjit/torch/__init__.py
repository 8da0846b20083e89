"""gmjit for PyTorch: the `grouped_mlp` op, the `GroupedMLP` module, layout helpers and the
expert-parallel `ExpertParallelMoE` layer.

The op is registered as torch.ops.gmjit.grouped_mlp (forward, with its fake kernel and autograd)
and torch.ops.gmjit.grouped_mlp_backward; `grouped_mlp` is the function to call.
`quantize_weights` (torch.ops.gmjit.quantize_weights) makes the FP8 recipes' weights;
`prepare` (a model's gmjit layers) and `prepare_layer` (one layer) compile the kernels ahead of
time, without a GPU. `invalidate_weight_caches` marks the copies cached from weights stale after
writes that neither move a version counter nor follow an optimizer step.
"""

from gmjit.torch import layouts
from gmjit.torch._checks import ACTIVATIONS, GLU_LAYOUTS, RECIPES
from gmjit.torch._op import grouped_mlp, quantize_weights
from gmjit.torch._prepare import GRADIENTS, PrepareReport, prepare, prepare_layer
from gmjit.torch._weight_cache import invalidate_weight_caches
from gmjit.torch.expert_parallel import ExpertParallelMoE
from gmjit.torch.module import GroupedMLP

__all__ = ["ACTIVATIONS", "ExpertParallelMoE", "GLU_LAYOUTS", "GRADIENTS", "GroupedMLP",
           "PrepareReport", "RECIPES", "grouped_mlp", "invalidate_weight_caches", "layouts",
           "prepare", "prepare_layer", "quantize_weights"]
