"""The reference block, exactly as KernelBench level 2 problem 8 writes it.

ModelNew (convpool._ops) must match it: same constructor, same parameters drawn from the RNG in
the same order, same output shape and dtype for every input this accepts.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv3d -> / divisor -> MaxPool3d -> AdaptiveAvgPool3d(1) -> + bias -> sum over sum_dim."""

    def __init__(self, in_channels, out_channels, kernel_size, divisor, pool_size, bias_shape, sum_dim):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.divisor = divisor
        self.max_pool = nn.MaxPool3d(pool_size)
        self.global_avg_pool = nn.AdaptiveAvgPool3d((1, 1, 1))
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.sum_dim = sum_dim

    def forward(self, x):
        x = self.conv(x)
        x = x / self.divisor
        x = self.max_pool(x)
        x = self.global_avg_pool(x)
        x = x + self.bias
        x = torch.sum(x, dim=self.sum_dim)
        return x
