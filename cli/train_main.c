/*
 * train_main.c: flint-train, the program behind `flint train` (cli/train.c; cli/cli.h says
 * why it is a program of its own). `flint train ARGS` runs `flint-train ARGS`.
 */
#include "cli/cli.h"

int main(int argc, char **argv) { return cmd_train(argc - 1, argv + 1); }
