#!/usr/bin/env python3
"""PyTorch's side of bench_train's ResNet rows: training steps of the same ResNet on random
images, at the same batch and thread count.

  torch_resnet.py resnet18|resnet50 SIZE CHANNELS CLASSES BATCH STEPS THREADS

The networks are flint's (gpu/nn/models.c): torchvision's ResNets, with a 3x3 stride-1 stem and
no max pool for images up to 64 pixels a side (CIFAR-style). A step is zero_grad, forward,
cross-entropy, backward and SGD with momentum, timed over STEPS after two warm-ups. Prints one
JSON line: {"images_per_s": ...}.
"""
import json
import os
import sys
import time

# A row's thread count is the whole process's: Debian's torch does its linear layers' GEMMs in
# OpenBLAS (pthreads), which otherwise starts a thread per core whatever torch.set_num_threads
# says, so that the "1 thread" row ran its GEMMs on 2 cores. Its OpenMP threads wait passively:
# spinning, they fought OpenBLAS's threads and anything else on a shared machine, and the
# 2-thread MLP row fell from about 9400 to 700-1000 images/s. Both variables are read when the
# libraries load, hence before torch is imported.
if __name__ == "__main__" and len(sys.argv) > 7:
    os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[7]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, convs, in_c, stride):
        super().__init__()
        layers = []
        c = in_c
        for i, (k, out, s) in enumerate(convs):
            layers += [nn.Conv2d(c, out, k, s, k // 2, bias=False), nn.BatchNorm2d(out)]
            if i < len(convs) - 1:
                layers.append(nn.ReLU())
            c = out
        self.main = nn.Sequential(*layers)
        self.short = (nn.Sequential() if stride == 1 and in_c == c else
                      nn.Sequential(nn.Conv2d(in_c, c, 1, stride, bias=False), nn.BatchNorm2d(c)))

    def forward(self, x):
        return torch.relu(self.main(x) + self.short(x))


def resnet(name, size, channels, classes):
    large = size > 64
    stem = ([nn.Conv2d(channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
            if large else [nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()])
    layers, in_c = stem, 64
    for stage, blocks in enumerate([2, 2, 2, 2] if name == "resnet18" else [3, 4, 6, 3]):
        w = 64 << stage
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            convs = ([(3, w, stride), (3, w, 1)] if name == "resnet18" else
                     [(1, w, 1), (3, w, stride), (1, 4 * w, 1)])
            layers.append(Block(convs, in_c, stride))
            in_c = convs[-1][1]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_c, classes)]
    return nn.Sequential(*layers)


def main():
    name, size, channels, classes, batch, steps, threads = sys.argv[1:8]
    size, channels, classes, batch, steps, threads = (int(size), int(channels), int(classes), int(batch), int(steps),
                                                      int(threads))
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = resnet(name, size, channels, classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(batch, channels, size, size) - 0.5
    y = torch.arange(batch) % classes

    def step():
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    print(json.dumps({"images_per_s": batch * steps / (time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
