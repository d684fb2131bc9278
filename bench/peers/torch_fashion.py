#!/usr/bin/env python3
"""PyTorch's side of bench_model: the same model, data, recipe and thread count as flint's row.

  torch_fashion.py MODEL THREADS EPOCHS TRAIN_IMAGES TEST_IMAGES BATCH LR SEED DATA_DIR [DEVICE]

DEVICE: cpu (the default) or cuda (eager mode on GPU 0; the data is moved there once).

MODEL: mlp (784-512-256-10) or cnn (conv5x5(32)-pool-conv5x5(64)-pool-fc1024-fc10). Data: the
Fashion-MNIST IDX files, standardised as flint does (mean 0.2860, std 0.3530). Recipe: SGD with
momentum 0.9 at a constant rate, no weight decay, a shuffle each epoch. Prints one JSON line:
{"images_per_s": ..., "test_acc": ..., "seconds": ...}; images_per_s counts training only.
"""
import gzip
import json
import os
import struct
import sys
import time

# A row's thread count is the whole process's: Debian's torch does its linear layers' GEMMs in
# OpenBLAS (pthreads), which otherwise starts a thread per core whatever torch.set_num_threads
# says, so that the "1 thread" row ran its GEMMs on 2 cores. Its OpenMP threads wait passively:
# spinning, they fought OpenBLAS's threads and anything else on a shared machine, and the
# 2-thread MLP row fell from about 9400 to 700-1000 images/s. Both variables are read when the
# libraries load, hence before torch is imported.
if __name__ == "__main__" and len(sys.argv) > 2:
    os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[2]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
from torch import nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def pick(directory, name):
    plain = os.path.join(directory, name)
    return plain if os.path.exists(plain) else plain + ".gz"


def load(directory, prefix, count):
    x = read_idx(pick(directory, prefix + "-images-idx3-ubyte"))[:count]
    y = read_idx(pick(directory, prefix + "-labels-idx1-ubyte"))[:count]
    x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
    return torch.from_numpy(x.reshape(-1, 1, 28, 28).copy()), torch.from_numpy(y.astype(np.int64))


def model_of(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 1024), nn.ReLU(), nn.Linear(1024, 10))


def main():
    name, threads, epochs, n_train, n_test, batch, lr, seed, directory = sys.argv[1:10]
    device = torch.device(sys.argv[10] if len(sys.argv) > 10 else "cpu")
    threads, epochs, n_train, n_test, batch = int(threads), int(epochs), int(n_train), int(n_test), int(batch)
    torch.set_num_threads(threads)
    torch.manual_seed(int(seed))
    xtr, ytr = load(directory, "train", n_train)
    xte, yte = load(directory, "t10k", n_test)
    xtr, ytr, xte, yte = xtr.to(device), ytr.to(device), xte.to(device), yte.to(device)
    model = model_of(name).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=float(lr), momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = len(xtr) // batch
    train_s = 0.0
    t_all = time.perf_counter()
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(xtr)).to(device)
        t0 = time.perf_counter()
        for k in range(steps_per_epoch):
            idx = order[k * batch:(k + 1) * batch]
            opt.zero_grad()
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the steps are queued: time them done
        train_s += time.perf_counter() - t0
    model.eval()
    correct = 0
    with torch.no_grad():
        for k in range(0, len(xte), 1000):
            correct += (model(xte[k:k + 1000]).argmax(1) == yte[k:k + 1000]).sum().item()
    print(json.dumps({"images_per_s": epochs * steps_per_epoch * batch / train_s, "test_acc": correct / len(xte),
                      "seconds": time.perf_counter() - t_all}))


if __name__ == "__main__":
    main()
