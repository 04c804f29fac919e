"""Frames: observations that are images or grids, read by convolutions (`model.encoder: cnn`).

A group's observations are frames when they have the shape `[H, W, C]` (PettingZoo's image
layout; `[H, W]` is one channel: `GroupInfo.frame_shape`). They travel flattened, as every
observation does, and stay uint8 where the env gives uint8 (an RGB frame): a rollout or
replay buffer holds a quarter of what float32 would take, and `scaled` turns them into [0, 1]
floats on the device as a network reads them. A global state of the shape `[H, W, C]` is a
frame too (`EnvInfo.state_frame`), which an on-policy centralised critic convolves; a uint8
one travels as bytes and an on-policy rollout keeps it so. `BatchedCNN` runs one stack of
convolutions per seed and per copy (an agent's own network) as grouped convolutions, so
that, like `BatchedMLP`, a seed's features do not depend on the seeds batched with it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def scaled(x: torch.Tensor) -> torch.Tensor:
    """uint8 frames as floats in [0, 1]; any other input as it is."""
    return x.float() / 255.0 if x.dtype == torch.uint8 else x


class BatchedCNN(nn.Module):
    """`seeds` x `copies` stacks of convolutions (`model.cnn`: plain, a ReLU after each; or
    the IMPALA network's residual stacks), flattened: frames `[S, c, N, *frame]` -> features
    `[S, c, N, F]`."""

    def __init__(
        self,
        seeds: int,
        copies: int,
        shape: tuple[int, int, int],
        cnn,
        generators: list[torch.Generator],
        init: str = "orthogonal",
        channels_first: bool = False,
    ):
        """shape: `(H, W, C)`; the frames come as `[H, W, C]`, or `[C, H, W]` where
        `channels_first`."""
        super().__init__()
        self.seeds, self.copies, self.shape = seeds, copies, shape
        self.channels_first, self.downsample = channels_first, cnn.downsample
        self.impala, self.stacks = cnn.style == "impala", len(cnn.channels)
        if emptied := cnn.emptied(shape):
            raise ValueError(f"model.cnn leaves nothing of frames {shape[0]}x{shape[1]}: {emptied}")
        sizes = cnn.sizes(shape)
        # (in, out, kernel, stride, padding) of each convolution, in the order they run
        convs: list[tuple[int, int, int, int, int]] = []
        for index, ((c_in, _, _), (out, _, _)) in enumerate(zip(sizes, sizes[1:], strict=False)):
            if self.impala:  # the stack's convolution, then two residual blocks of two
                convs += [(c_in, out, 3, 1, 1)] + [(out, out, 3, 1, 1)] * 4
            else:
                convs.append((c_in, out, cnn.kernels[index], cnn.strides[index], 0))
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.geometry = [(stride, padding) for _, _, _, stride, padding in convs]
        for c_in, out, kernel, _, _ in convs:
            weight = torch.empty(seeds, copies, out, c_in, kernel, kernel)
            bias = torch.zeros(seeds, copies, out)
            fan_in = c_in * kernel * kernel
            for s in range(seeds):
                for k in range(copies):
                    if init == "torch":  # nn.Conv2d's default
                        bound = 1 / math.sqrt(fan_in)
                        nn.init.uniform_(weight[s, k], -bound, bound, generator=generators[s])
                        nn.init.uniform_(bias[s, k], -bound, bound, generator=generators[s])
                    else:
                        flat = weight[s, k].view(out, fan_in)
                        nn.init.orthogonal_(flat, math.sqrt(2), generator=generators[s])
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(bias))
        channels, height, width = sizes[-1]
        self.features = channels * height * width

    def forward(self, x: torch.Tensor, pick=None) -> torch.Tensor:
        """x `[S, c, N, *frame]` float; `pick` selects one copy of each seed's weights
        (`select_copy`), with c = 1."""
        S, c, N = x.shape[:3]
        H, W, C = self.shape
        groups = S * c
        # [N, S * c * C, H, W]: each seed's (and copy's) channels side by side, one group each
        if self.channels_first:
            h = x.reshape(groups, N, C, H, W).transpose(0, 1)
        else:
            h = x.reshape(groups, N, H, W, C).permute(1, 0, 4, 2, 3)
        h = h.reshape(N, groups * C, H, W)
        if self.downsample > 1:
            h = F.avg_pool2d(h, self.downsample)
        layers = iter(zip(self.weights, self.biases, self.geometry, strict=True))

        def conv(h: torch.Tensor) -> torch.Tensor:
            weight, bias, (stride, padding) = next(layers)
            w, b = (weight, bias) if pick is None else (pick(weight), pick(bias))
            return F.conv2d(
                h, w.reshape(-1, *w.shape[3:]), b.reshape(-1), stride, padding, groups=groups
            )

        if self.impala:
            for _ in range(self.stacks):
                h = F.max_pool2d(conv(h), 3, 2, 1)
                for _ in range(2):  # residual blocks
                    h = h + conv(F.relu(conv(F.relu(h))))
            h = F.relu(h)
        else:
            for _ in self.geometry:
                h = F.relu(conv(h))
        return h.reshape(N, groups, -1).transpose(0, 1).reshape(S, c, N, -1)
