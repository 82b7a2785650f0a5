"""convpool: Conv3d -> / divisor -> MaxPool3d -> global mean -> + bias -> sum, fused.

    import convpool
    model = convpool.ModelNew(in_channels, out_channels, kernel_size, divisor, pool_size,
                              bias_shape, sum_dim)       # builds the extension on first use
    y = model(x)                                         # same result as convpool.Model

Model is the PyTorch reference (KernelBench level 2 #8); ModelNew is its drop-in replacement.
block() is ModelNew.forward as a function; forward_op() is the raw custom op
(torch.ops.convpool.forward); explain(model, x) says which kernel model(x) runs and why.
See python/README.md.
"""
from ._build import BuildError, SourcesNotFoundError, build_info
from ._ops import ModelNew, block, check_block_args, explain, forward_op, load, pooled_backward, release_cpu_scratch
from .model import Model

__version__ = "0.1.0"

__all__ = ["Model", "ModelNew", "block", "explain", "forward_op", "load", "pooled_backward",
           "check_block_args", "release_cpu_scratch", "build_info", "BuildError", "SourcesNotFoundError"]
