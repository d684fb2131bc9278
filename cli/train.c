/*
 * train.c: `flint train`: synchronous data-parallel training (gpu/parallel/train.h) on Fashion-MNIST or
 * synthetic-imagenet, with a progress line per epoch and the curves as CSV and SVG.
 *
 * Exit status: 0 on success; 2 for a usage error (every option is checked before anything
 * starts, numbers strictly: the whole text must be the number); 1 when training fails (the
 * message is fl_last_error()).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gpu/parallel/train.h"

/* --model FILE.so[:SYMBOL]: a value with a '/' or ".so" names a library. Fills model_library
 * and model_symbol (pointing into a static copy of `v`); false for a built-in model's name. */
static bool model_library_parse(const char *v, gpu_train_options *o) {
  static char path[4096];
  if (!strchr(v, '/') && !strstr(v, ".so")) return false;
  snprintf(path, sizeof path, "%s", v);
  char *so = strstr(path, ".so:"), *colon = so ? so + 3 : NULL;
  o->model_symbol = NULL;
  if (colon) {
    *colon = '\0';
    o->model_symbol = colon + 1;
  }
  o->model_library = path;
  return true;
}

static const char train_usage_text[] =
    "usage: flint train --model mlp|cnn|resnet18|resnet50|transformer|gpt|FILE.so[:SYMBOL]\n"
    "                   --data fashion-mnist|synthetic-imagenet|libsvm:PATH|csv:PATH|idx:IMAGES,LABELS\n"
    "                          |imagefolder:DIR|text:PATH [options]\n"
    "\n"
    "Trains a network by synchronous data-parallel SGD (or Adam, AdamW, LARS, LAMB): R ranks (one barrier task each) read\n"
    "their share of the cached data set, allreduce gradients in buckets overlapped with the\n"
    "backward pass and take the same step; the test set is evaluated at each epoch's end.\n"
    "Prints a progress line per epoch (loss, accuracy, images per second, and the share of\n"
    "the steps' time rank 0 waited for its input; on a terminal redrawn as the epoch goes, with\n"
    "an ETA) and writes the curves as CSV and SVG.\n"
    "\n"
    "--model transformer trains a transformer encoder (an image's rows are its tokens) on a\n"
    "grid of D x T x P ranks: data, tensor (Megatron-LM) and pipeline parallel (GPipe, 1F1B,\n"
    "interleaved 1F1B), and reports the pipeline's bubble and each stage's peak activations.\n"
    "--model gpt trains its GPT form (pre-LN blocks, causal attention) on the bytes of\n"
    "--data text:PATH, any text file, predicting each byte from those before it; the file's\n"
    "last tenth is the test set; loss (per byte, also in bits) and accuracy are the next byte's.\n"
    "\n"
    "options:\n"
    "  --model M           mlp, cnn, resnet18, resnet50 (Goyal et al.'s zero-gamma blocks) or\n"
    "                      transformer, or your own: a shared library\n"
    "                      (a path with a '/' or ending in .so) exporting an fl_model_builder\n"
    "                      (flint/train.h) under SYMBOL (default flint_model); it is shipped to\n"
    "                      the ranks, as a job binary is (required)\n"
    "  --data D            fashion-mnist (IDX files, 28x28, 10 classes), synthetic-imagenet\n"
    "                      (seeded 3x224x224 images, 1000 classes, for throughput), or your files:\n"
    "                      libsvm:PATH or csv:PATH (rows of F features as 1x1xF samples, the\n"
    "                      label first in CSV; classes 0..K-1, or -1/+1), idx:IMAGES,LABELS\n"
    "                      (an IDX pair, 10 classes), imagefolder:DIR (DIR/train and DIR/val,\n"
    "                      each CLASS/NAME.jpg|jpeg|png as torchvision's ImageFolder, decoded\n"
    "                      once and cached); files are read by the executors (required)\n"
    "  --test-data D       the set evaluated after each epoch, in --data's format (required\n"
    "                      with libsvm:, csv: and idx:; with imagefolder:DIR, DIR is then the\n"
    "                      training folder itself)\n"
    "  --image-size N      imagefolder: the images' side, 1 to 1024 (default 224)\n"
    "  --no-augment        imagefolder: train on centre crops instead of a new random\n"
    "                      resized crop and flip of every image every epoch\n"
    "  --data-dir DIR      Fashion-MNIST's folder (default /usr/share/datasets/fashion-mnist)\n"
    "  --synthetic-images N  synthetic-imagenet training images per epoch (default 4 x batch)\n"
    "  --train-images N    fashion-mnist: train on the first N images (default all 60000)\n"
    "  --test-images N     fashion-mnist: evaluate on the first N images (default all 10000)\n"
    "  --no-shuffle        keep the images' order every epoch (rank r of R takes images r,\n"
    "                      r+R, ...: R ranks then take the same global batches as 1 rank)\n"
    "  --ranks R           data-parallel ranks, 1 to 1024 (default 1)\n"
    "  --device D          cpu (default) or cuda (each rank on its executor's GPU)\n"
    "  --batch B           the GLOBAL mini-batch, a multiple of R (default 256)\n"
    "  --accumulate K      gradient accumulation: each rank runs its B / R images of a step\n"
    "                      as K micro-batches of B / (R x K), adding their gradients, and\n"
    "                      allreduces once after the last: the same step as batch B in the\n"
    "                      memory of a micro-batch (batch norm then sees micro-batches); B\n"
    "                      must be a multiple of R x K (default 1; not the transformer)\n"
    "  --lr LR             base learning rate for a batch of 256 (default 0.1); the run uses\n"
    "                      LR x B / 256 (the linear scaling rule)\n"
    "  --warmup E          gradual warmup over E epochs, E >= 0 and < N (default 0)\n"
    "  --epochs N          epochs, N >= 1 (default 10)\n"
    "  --decay D           after warmup: cosine (default, to 0 at the end), step, poly\n"
    "                      (LR x (1 - t)^P, t from 0 to 1 after warmup) or none\n"
    "  --milestones E,E..  step decay: x0.1 at these epochs (default 50% and 75% of N)\n"
    "  --power P           poly decay's power, 0 < P <= 100 (default 2)\n"
    "  --optimizer O       sgd (default), adam, adamw (decoupled weight decay), lars or lamb\n"
    "                      (layer-wise trust ratios, You et al.), or adagrad (Downpour's, on\n"
    "                      the parameter servers: --sync asp or ssp:S)\n"
    "  --momentum M        sgd and lars, 0 <= M < 1 (default 0.9)\n"
    "  --nesterov          sgd: Nesterov momentum\n"
    "  --beta1 B, --beta2 B  adam, adamw and lamb: the moments' decay, in [0, 1)\n"
    "                      (default 0.9 and 0.999)\n"
    "  --eps E             adam, adamw and lamb: added to the denominator, > 0 (default 1e-8)\n"
    "  --trust-coef C      lars: the trust coefficient eta, > 0 (default 0.001)\n"
    "  --weight-decay W    weight decay, W >= 0 (default 5e-4): L2 for sgd, adam and lars,\n"
    "                      decoupled for adamw and lamb\n"
    "  --no-decay-norm-bias  no weight decay (nor lars/lamb trust ratio) on biases and norm\n"
    "                      parameters, the 1-D ones (the default, as Goyal et al.)\n"
    "  --decay-all         weight decay (and trust ratio) on every parameter\n"
    "  --label-smoothing E  mix the one-hot targets with the uniform one by E (PyTorch's\n"
    "                      CrossEntropyLoss label_smoothing; training loss only; default 0)\n"
    "  --clip-grad-norm X  scale the averaged gradients to global norm X when it is larger\n"
    "                      (not the transformer)\n"
    "  --precision P       cuda: the precision of the matrix products, fp32 (default), tf32,\n"
    "                      bf16 or fp16 (with dynamic loss scaling); weights, activations and\n"
    "                      the rest stay fp32. The cpu device computes in fp32 only\n"
    "  --seed S            weights, shuffles and synthetic data (default 1)\n"
    "  --allreduce A       host backend: auto (default), ring, halving-doubling, tree,\n"
    "                      naive, parameter-server, double-tree, butterfly or hierarchical\n"
    "  --bucket-mb MB      gradient bucket size in MiB, > 0 (default 4)\n"
    "  --sync S            how the ranks keep their replicas together: bsp (default: the\n"
    "                      gradients allreduced every step), local:TAU (local SGD: each rank\n"
    "                      steps alone, the weights averaged every TAU steps) or adacomm[:TAU0]\n"
    "                      (local SGD whose period shrinks from TAU0, default 16, as the loss\n"
    "                      falls; Wang and Joshi's AdaComm), asp or ssp:S (the weights on\n"
    "                      parameter servers, the ranks their workers, Downpour SGD: asp never\n"
    "                      waits; ssp:S lets a worker run at most S steps ahead of the\n"
    "                      slowest, ssp:0 is synchronous SGD through the servers). asp and ssp\n"
    "                      take --optimizer sgd (momentum 0, the default there), adagrad or\n"
    "                      adam (the servers' updates, at a fixed rate), models without batch\n"
    "                      norm, and R task slots at once (docs/gpu.md)\n"
    "  --ps-fetch N        asp, ssp: a worker pulls the weights every N steps (default 1)\n"
    "  --ps-push N         asp, ssp: and pushes the gradients of N steps at once (default 1)\n"
    "  --compress C        gradient compression with --sync bsp (PyTorch DDP's comm hooks):\n"
    "                      none (default), fp16 or bf16 (16-bit allreduce), topk:RATIO (the\n"
    "                      largest RATIO in (0, 1] of each bucket, with error feedback),\n"
    "                      powersgd:R (rank-R PowerSGD, error feedback) or onebit (signs and\n"
    "                      a scale, error feedback); ranks join over the host backend\n"
    "  --no-overlap        allreduce each bucket inside backward instead of on the rank's\n"
    "                      communication thread while backward goes on (for comparison)\n"
    "  --master M          local[*] (default), local[N], local-cluster[E,C,MB] or\n"
    "                      flint://HOST:PORT; needs R free task slots (GPU executors for cuda)\n"
    "  --csv PATH          the curves as CSV (default flint-train.csv)\n"
    "  --svg PATH          the curves as SVG (default flint-train.svg)\n"
    "  --checkpoint PATH   write the final weights and optimizer state there\n"
    "  --resume PATH       start from a checkpoint that --checkpoint wrote (same model and\n"
    "                      data shape; not the transformer): train from its epoch to --epochs\n"
    "  --quiet             no progress line\n"
    "  --trick             --model cnn only: Krizhevsky's \"one weird trick\": the convolutions\n"
    "                      data parallel (each rank its B / R images), the fully connected\n"
    "                      layers split over the R ranks by units, on the whole batch (the\n"
    "                      cnn without batch norm, two FC layers of 512: R must divide 512;\n"
    "                      --sync bsp, no --checkpoint; docs/parallelism.md)\n"
    "transformer options:\n"
    "  --dp D              data-parallel replicas (the same as --ranks; default 1)\n"
    "  --tp T              tensor-parallel ranks per stage, dividing --heads and --ffn (default 1)\n"
    "  --pp P              pipeline stages (default 1); D x T x P barrier tasks in all, and\n"
    "                      --batch must be a multiple of D x T x P\n"
    "  --schedule S        gpipe, 1f1b (default), interleaved, pipedream (asynchronous\n"
    "                      1F1B with weight stashing) or 2bw (PipeDream-2BW)\n"
    "  --window K          pipedream, 2bw: mini-batches between flushes (default 8)\n"
    "  --replicas R0,R1,.. stage s on Rs ranks taking its micro-batches round robin\n"
    "                      (PipeDream's 1F1B-RR; sets --pp); D x (R0 + R1 + ...) tasks in\n"
    "                      all; --tp 1, --chunks 1, not interleaved\n"
    "  --replicas auto:W   the stages and their replicas chosen by PipeDream's partitioner\n"
    "                      over pipelines of W ranks (at most --pp stages; default W), from\n"
    "                      a profile and the measured link; D x W tasks\n"
    "  --vertical-sync     pipedream: every stage uses the version the first stage used\n"
    "  --microbatches M    micro-batches per replica's batch, dividing --batch / D (default 1)\n"
    "  --chunks V          model chunks per pipeline rank, for interleaved (default 1)\n"
    "  --recompute [full|selective]\n"
    "                      full (the default): keep only stage inputs and run forward again\n"
    "                      before backward; selective: keep all but the attention's [seq, seq]\n"
    "                      scores and probabilities, recomputed in backward (Korthikanti et al.)\n"
    "  --sequence-parallel between the tensor-parallel regions, each of the --tp ranks keeps\n"
    "                      seq / tp of the tokens (layer norm, dropout, residuals; needs --tp > 1\n"
    "                      dividing the sequence)\n"
    "  --hidden H          model width (default 64)\n"
    "  --heads N           attention heads, dividing --hidden (default 4)\n"
    "  --ffn F             MLP inner width (default 4 x hidden)\n"
    "  --blocks K          transformer blocks (default 2)\n"
    "  --dropout P         dropout probability, 0 <= P < 1 (default 0.1)\n"
    "  --seq S             --model gpt: bytes per sample (default 64)\n"
    "  --plan auto         choose the grid, micro-batches and stage cut (Alpa-style: a profile of\n"
    "                      the units, the calibrated links, a search): prints the plan and its\n"
    "                      predicted step time, trains it and prints the measured one; --dp,\n"
    "                      --tp, --pp, --microbatches, --schedule and --chunks are then errors\n"
    "  --world W           the ranks --plan auto plans for (required with it)\n"
    "  --plan-memory MB    a rank's memory for --plan auto (default: no limit)\n"
    "  --plan-max-microbatches M  the most micro-batches --plan auto tries (default 32)\n"
    "  --experts E         mixture of experts: E expert MLPs in place of a block's MLP, spread\n"
    "                      over the --dp ranks (E a multiple of D; default 0: none)\n"
    "  --top-k K           experts per token, 1 (Switch) to E (default 2, GShard)\n"
    "  --capacity-factor C slots per expert and sample: C x seq x K / E, rounded up (default 1.25)\n"
    "  --aux-alpha A       the balancing loss's weight (default 0.01)\n"
    "  --moe-every N       experts in every N-th block: 1 every block (default), 2 every other\n"
    "  --timeline-csv PATH every rank's last-step timeline as CSV\n"
    "  --timeline-svg PATH the same drawn as a chart\n"
    "  --conf KEY=VALUE    a setting ('flint config' lists them), e.g. log=debug\n"
    "  -h, --help          this text\n"
    "  --version           the version\n"
    "Options take their value as --opt VALUE or --opt=VALUE.\n"
    "\n"
    "A loss that turns non-finite stops the run (exit 1) naming the step and the learning\n"
    "rate: lower --lr, or warm up to it with --warmup.\n"
    "\n"
    "example (the large-batch check: compare with --batch 256 --warmup 0; at batch 8192 the\n"
    "cnn diverges from --lr 0.05 and the mlp from 0.02, see docs/gpu.md; on a GPU add\n"
    "--device cuda):\n"
    "  flint train --model cnn --data fashion-mnist --ranks 8 --batch 8192 --lr 0.01 \\\n"
    "      --warmup 5 --epochs 30 --master 'local[8]' --csv large.csv --svg large.svg\n"
    "example (a global batch of 16384 with LARS on 2 cpu ranks, each running its 8192\n"
    "images as 32 micro-batches of 256):\n"
    "  flint train --model cnn --data fashion-mnist --ranks 2 --batch 16384 --accumulate 32 \\\n"
    "      --optimizer lars --lr 0.1 --warmup 2 --decay poly --epochs 10 --master 'local[2]'\n"
    "example (hybrid: 2 replicas of 2-way tensor x 2-stage pipeline parallelism):\n"
    "  flint train --model transformer --data fashion-mnist --dp 2 --tp 2 --pp 2 \\\n"
    "      --schedule 1f1b --microbatches 4 --batch 64 --epochs 1 --master 'local[8]' \\\n"
    "      --timeline-svg tl.svg\n"
    "example (a byte-level GPT on a text file, tensor x pipeline parallel):\n"
    "  flint train --model gpt --data text:docs/parallelism.md --seq 64 --hidden 64 --heads 4 \\\n"
    "      --blocks 2 --tp 2 --pp 2 --microbatches 4 --batch 32 --optimizer adam --lr 0.01 \\\n"
    "      --epochs 4 --master 'local[4]'\n";

#define train_usage_error(...) cli_usage_error("train", __VA_ARGS__)

/* "10,20,25" into o->milestones. */
static int parse_milestones(const char *text, gpu_train_options *o) {
  char buf[256];
  if (strlen(text) >= sizeof buf) return train_usage_error("--milestones '%s' is too long", text);
  snprintf(buf, sizeof buf, "%s", text);
  o->num_milestones = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (o->num_milestones == OPTIM_MAX_MILESTONES)
      return train_usage_error("--milestones '%s': at most %d epochs", text, OPTIM_MAX_MILESTONES);
    if (!cli_parse_double(tok, &o->milestones[o->num_milestones]))
      return train_usage_error("--milestones '%s': '%s' is not a number", text, tok);
    o->num_milestones++;
  }
  if (o->num_milestones == 0) return train_usage_error("--milestones '%s' names no epoch", text);
  return 0;
}

/* The long options of flint train: those that take a value, then the switches. Every row's
 * code is OPT_LONG: parse_args finds the option by its index and compares names. */
enum { OPT_LONG = 256 };
#define VALUED(name) {name, required_argument, NULL, OPT_LONG}
#define SWITCH(name) {name, no_argument, NULL, OPT_LONG}
static const struct option train_longopts[] = {
    VALUED("model"), VALUED("data"), VALUED("test-data"), VALUED("data-dir"), VALUED("synthetic-images"), VALUED("train-images"),
    VALUED("test-images"), VALUED("ranks"), VALUED("device"), VALUED("batch"), VALUED("lr"), VALUED("warmup"),
    VALUED("epochs"), VALUED("decay"), VALUED("milestones"), VALUED("momentum"), VALUED("weight-decay"),
    VALUED("seed"), VALUED("allreduce"), VALUED("bucket-mb"), VALUED("master"), VALUED("csv"), VALUED("svg"),
    VALUED("checkpoint"), VALUED("resume"), VALUED("dp"), VALUED("tp"), VALUED("pp"), VALUED("schedule"), VALUED("window"), VALUED("replicas"), VALUED("microbatches"),
    VALUED("chunks"), VALUED("hidden"), VALUED("heads"), VALUED("ffn"), VALUED("blocks"), VALUED("dropout"),
    VALUED("timeline-csv"), VALUED("timeline-svg"), VALUED("optimizer"), VALUED("beta1"), VALUED("beta2"),
    VALUED("eps"), VALUED("trust-coef"), VALUED("clip-grad-norm"), VALUED("label-smoothing"), VALUED("precision"),
    VALUED("sync"), VALUED("compress"), VALUED("power"), VALUED("image-size"), VALUED("accumulate"), VALUED("ps-fetch"),
    VALUED("ps-push"), VALUED("seq"), VALUED("plan"), VALUED("world"), VALUED("plan-memory"),
    VALUED("plan-max-microbatches"), VALUED("experts"), VALUED("top-k"), VALUED("capacity-factor"),
    VALUED("aux-alpha"), VALUED("moe-every"), SWITCH("nesterov"), SWITCH("quiet"),
    SWITCH("no-shuffle"), SWITCH("no-overlap"),
    SWITCH("recompute"), SWITCH("vertical-sync"), SWITCH("sequence-parallel"), SWITCH("no-decay-norm-bias"),
    SWITCH("decay-all"), SWITCH("no-augment"), SWITCH("trick"),
    CLI_COMMON_LONG_OPTIONS, {0}};
#undef VALUED
#undef SWITCH

/* Fills `o` from argv (after "train"). Returns 0, 2 for a usage error, -1 after --help or -2
 * after --version. */
static int parse_args(int argc, char **argv, gpu_train_options *o) {
  *o = (gpu_train_options)GPU_TRAIN_OPTIONS_INIT;
  o->master = "local[*]";
  o->csv_path = "flint-train.csv";
  o->svg_path = "flint-train.svg";
  o->progress = stdout;
  o->plan_report = stdout;
  bool have_model = false, have_data = false, pp_given = false;
  uint32_t replica_stages = 0;
  const char *test_data = NULL;
  const char *adam_opt = NULL, *lars_opt = NULL, *momentum_opt = NULL; /* given, for the checks at the end */
  bool eps_given = false, decay_given = false;
  const char *grid_opt = NULL; /* the first of --dp/--ranks/--tp/--pp/--microbatches/--schedule/--chunks given */
  int c, index;
  optind = 0; /* afresh; argv - 1 is the command's name, getopt's argv[0] */
  while ((c = getopt_long(argc + 1, argv - 1, ":hV", train_longopts, &index)) != -1) {
    if (c == CLI_OPT_HELP) return -1;
    if (c == CLI_OPT_VERSION) return -2;
    if (c != OPT_LONG) return cli_option_error("train", c, argv - 1, train_longopts);
    char opt_buf[32]; /* "--" and the option's full name, as the messages name it */
    snprintf(opt_buf, sizeof opt_buf, "--%s", train_longopts[index].name);
    const char *opt = opt_buf;
    if (strcmp(opt, "--nesterov") == 0) {
      o->optim.nesterov = true;
      continue;
    }
    if (strcmp(opt, "--no-decay-norm-bias") == 0 || strcmp(opt, "--decay-all") == 0) {
      o->optim.decay_all = opt[2] == 'd';
      continue;
    }
    if (strcmp(opt, "--quiet") == 0) {
      o->progress = NULL;
      continue;
    }
    if (strcmp(opt, "--no-shuffle") == 0) {
      o->shuffle = false;
      continue;
    }
    if (strcmp(opt, "--no-overlap") == 0) {
      o->overlap = false;
      continue;
    }
    if (strcmp(opt, "--no-augment") == 0) {
      o->no_augment = true;
      continue;
    }
    if (strcmp(opt, "--recompute") == 0) {
      /* --recompute [full|selective]: an optional word after it (full, the default, keeps
       * only stage inputs; selective only drops the attention's [seq, seq] tensors). */
      const char *next = optind < argc + 1 ? (argv - 1)[optind] : NULL;
      if (next && (strcmp(next, "selective") == 0 || strcmp(next, "full") == 0)) {
        optind++;
        if (next[0] == 's') {
          o->recompute_selective = true;
          continue;
        }
      }
      o->recompute = true;
      continue;
    }
    if (strcmp(opt, "--trick") == 0) {
      o->trick = true;
      continue;
    }
    if (strcmp(opt, "--vertical-sync") == 0) {
      o->vertical_sync = true;
      continue;
    }
    if (strcmp(opt, "--sequence-parallel") == 0) {
      o->sequence_parallel = true;
      continue;
    }
    const char *v = optarg;
    double d;
    if (strcmp(opt, "--model") == 0) {
      o->gpt = strcmp(v, "gpt") == 0; /* the transformer in its GPT form */
      if (o->gpt) {
        o->model = NN_TRANSFORMER;
      } else if (model_library_parse(v, o)) {
        o->model = NN_LIBRARY;
      } else if (gpu_train_model_parse(v, &o->model) != FL_OK) {
        return train_usage_error("unknown model '%s' (mlp, cnn, resnet18, resnet50, transformer or gpt, or a FILE.so that exports "
                                 "a model builder)", v);
      }
      have_model = true;
    } else if (strcmp(opt, "--data") == 0) {
      if (gpu_train_source_parse(v, &o->data, &o->data_path) != FL_OK) return train_usage_error("%s", fl_last_error());
      have_data = true;
    } else if (strcmp(opt, "--test-data") == 0) {
      test_data = v;
    } else if (strcmp(opt, "--data-dir") == 0) {
      o->data_dir = v;
    } else if (strcmp(opt, "--image-size") == 0) {
      if (!cli_parse_u32(v, &o->image_size) || o->image_size < 1 || o->image_size > 1024)
        return train_usage_error("--image-size '%s' is not a whole number from 1 to 1024", v);
    } else if (strcmp(opt, "--synthetic-images") == 0) {
      if (!cli_parse_u64(v, 1ull << 40, &o->synthetic_train_images) || o->synthetic_train_images < 1)
        return train_usage_error("--synthetic-images '%s' is not a whole number >= 1", v);
    } else if (strcmp(opt, "--train-images") == 0) {
      if (!cli_parse_u64(v, 1ull << 40, &o->max_train_images) || o->max_train_images < 1)
        return train_usage_error("--train-images '%s' is not a whole number >= 1", v);
    } else if (strcmp(opt, "--test-images") == 0) {
      if (!cli_parse_u64(v, 1ull << 40, &o->max_test_images) || o->max_test_images < 1)
        return train_usage_error("--test-images '%s' is not a whole number >= 1", v);
    } else if (strcmp(opt, "--ranks") == 0 || strcmp(opt, "--dp") == 0) {
      if (!cli_parse_u32(v, &o->ranks) || o->ranks < 1 || o->ranks > 1024)
        return train_usage_error("%s '%s' is not a whole number from 1 to 1024", opt, v);
    } else if (strcmp(opt, "--tp") == 0 || strcmp(opt, "--pp") == 0) {
      uint32_t *dst = opt[2] == 't' ? &o->tp : &o->pp;
      pp_given |= opt[2] == 'p';
      if (!cli_parse_u32(v, dst) || *dst < 1 || *dst > 1024)
        return train_usage_error("%s '%s' is not a whole number from 1 to 1024", opt, v);
    } else if (strcmp(opt, "--schedule") == 0) {
      if (pp_schedule_parse(v, &o->schedule) != FL_OK)
        return train_usage_error("unknown schedule '%s' (gpipe, 1f1b, interleaved, pipedream or 2bw)", v);
    } else if (strcmp(opt, "--replicas") == 0) {
      if (gpu_train_replicas_parse(v, o->replicas, &replica_stages, &o->replicas_auto) != FL_OK)
        return train_usage_error("%s", fl_last_error());
    } else if (strcmp(opt, "--window") == 0) {
      if (!cli_parse_u32(v, &o->window) || o->window < 1 || o->window > 4096)
        return train_usage_error("%s '%s' is not a whole number from 1 to 4096", opt, v);
    } else if (strcmp(opt, "--microbatches") == 0 || strcmp(opt, "--chunks") == 0 || strcmp(opt, "--hidden") == 0 ||
               strcmp(opt, "--heads") == 0 || strcmp(opt, "--blocks") == 0) {
      uint32_t *dst = strcmp(opt, "--microbatches") == 0 ? &o->microbatches
                      : strcmp(opt, "--chunks") == 0     ? &o->chunks
                      : strcmp(opt, "--hidden") == 0     ? &o->hidden
                      : strcmp(opt, "--heads") == 0      ? &o->heads
                                                         : &o->blocks;
      if (!cli_parse_u32(v, dst) || *dst < 1) return train_usage_error("%s '%s' is not a whole number >= 1", opt, v);
    } else if (strcmp(opt, "--seq") == 0) {
      if (!cli_parse_u32(v, &o->seq) || o->seq < 1 || o->seq > 4096)
        return train_usage_error("--seq '%s' is not a whole number from 1 to 4096", v);
    } else if (strcmp(opt, "--experts") == 0 || strcmp(opt, "--top-k") == 0 || strcmp(opt, "--moe-every") == 0) {
      uint32_t *dst = opt[2] == 'e' ? &o->experts : opt[2] == 't' ? &o->top_k : &o->moe_every;
      if (!cli_parse_u32(v, dst) || *dst < 1 || *dst > 4096)
        return train_usage_error("%s '%s' is not a whole number from 1 to 4096", opt, v);
    } else if (strcmp(opt, "--capacity-factor") == 0) {
      if (!cli_parse_double(v, &o->capacity_factor) || !(o->capacity_factor > 0) || o->capacity_factor > 1000)
        return train_usage_error("--capacity-factor '%s' is not a number above 0 (at most 1000)", v);
    } else if (strcmp(opt, "--aux-alpha") == 0) {
      if (!cli_parse_double(v, &o->moe_alpha) || !(o->moe_alpha >= 0) || o->moe_alpha > 1000)
        return train_usage_error("--aux-alpha '%s' is not a number from 0 to 1000", v);
    } else if (strcmp(opt, "--ffn") == 0) {
      if (!cli_parse_u32(v, &o->ffn) || o->ffn < 1) return train_usage_error("--ffn '%s' is not a whole number >= 1", v);
    } else if (strcmp(opt, "--dropout") == 0) {
      if (!cli_parse_double(v, &o->dropout) || o->dropout < 0 || o->dropout >= 1)
        return train_usage_error("--dropout '%s' is not a number in [0, 1)", v);
    } else if (strcmp(opt, "--timeline-csv") == 0) {
      o->timeline_csv_path = v;
    } else if (strcmp(opt, "--timeline-svg") == 0) {
      o->timeline_svg_path = v;
    } else if (strcmp(opt, "--device") == 0) {
      if (strcmp(v, "cpu") == 0) o->device = FL_DEVICE_CPU;
      else if (strcmp(v, "cuda") == 0) o->device = FL_DEVICE_CUDA;
      else return train_usage_error("unknown device '%s' (cpu or cuda)", v);
    } else if (strcmp(opt, "--batch") == 0) {
      if (!cli_parse_u32(v, &o->batch) || o->batch < 1 || o->batch > (1u << 20))
        return train_usage_error("--batch '%s' is not a whole number from 1 to 1048576", v);
    } else if (strcmp(opt, "--accumulate") == 0) {
      if (!cli_parse_u32(v, &o->accumulate) || o->accumulate < 1 || o->accumulate > (1u << 20))
        return train_usage_error("--accumulate '%s' is not a whole number from 1 to 1048576", v);
    } else if (strcmp(opt, "--lr") == 0) {
      if (!cli_parse_double(v, &o->lr) || o->lr <= 0) return train_usage_error("--lr '%s' is not a number > 0", v);
    } else if (strcmp(opt, "--warmup") == 0) {
      if (!cli_parse_double(v, &o->warmup_epochs) || o->warmup_epochs < 0)
        return train_usage_error("--warmup '%s' is not a number of epochs >= 0", v);
    } else if (strcmp(opt, "--epochs") == 0) {
      if (!cli_parse_u32(v, &o->epochs) || o->epochs < 1 || o->epochs > 100000)
        return train_usage_error("--epochs '%s' is not a whole number from 1 to 100000", v);
    } else if (strcmp(opt, "--decay") == 0) {
      if (optim_decay_parse(v, &o->decay) != FL_OK)
        return train_usage_error("unknown decay '%s' (cosine, step, poly or none)", v);
      decay_given = true;
    } else if (strcmp(opt, "--milestones") == 0) {
      int rc = parse_milestones(v, o);
      if (rc) return rc;
    } else if (strcmp(opt, "--momentum") == 0) {
      if (!cli_parse_double(v, &d) || d < 0 || d >= 1) return train_usage_error("--momentum '%s' is not a number in [0, 1)", v);
      o->optim.momentum = (float)d;
      momentum_opt = "--momentum";
    } else if (strcmp(opt, "--weight-decay") == 0) {
      if (!cli_parse_double(v, &d) || d < 0) return train_usage_error("--weight-decay '%s' is not a number >= 0", v);
      o->optim.weight_decay = (float)d;
    } else if (strcmp(opt, "--optimizer") == 0) {
      if (optim_kind_parse(v, &o->optim.kind) != FL_OK)
        return train_usage_error("unknown optimizer '%s' (sgd, adam, adamw, lars, lamb, or adagrad with --sync asp "
                                 "or ssp:S)", v);
    } else if (strcmp(opt, "--beta1") == 0 || strcmp(opt, "--beta2") == 0) {
      if (!cli_parse_double(v, &d) || d < 0 || d >= 1) return train_usage_error("%s '%s' is not a number in [0, 1)", opt, v);
      *(opt[6] == '1' ? &o->optim.beta1 : &o->optim.beta2) = (float)d;
      adam_opt = opt[6] == '1' ? "--beta1" : "--beta2";
    } else if (strcmp(opt, "--eps") == 0 || strcmp(opt, "--trust-coef") == 0) {
      if (!cli_parse_double(v, &d) || !(d > 0) || !isfinite((float)d) || (float)d == 0)
        return train_usage_error("%s '%s' is not a number > 0", opt, v);
      *(opt[2] == 'e' ? &o->optim.eps : &o->optim.trust_coef) = (float)d;
      if (opt[2] == 'e') eps_given = true;
      else lars_opt = "--trust-coef";
    } else if (strcmp(opt, "--label-smoothing") == 0) {
      if (!cli_parse_double(v, &o->label_smoothing) || !(o->label_smoothing >= 0 && o->label_smoothing < 1))
        return train_usage_error("--label-smoothing '%s' is not a number in [0, 1)", v);
    } else if (strcmp(opt, "--sync") == 0) {
      if (gpu_train_sync_parse(v, &o->sync, &o->tau, &o->staleness) != FL_OK)
        return train_usage_error("%s", fl_last_error());
    } else if (strcmp(opt, "--ps-fetch") == 0 || strcmp(opt, "--ps-push") == 0) {
      uint32_t *dst = opt[5] == 'f' ? &o->ps_fetch : &o->ps_push;
      if (!cli_parse_u32(v, dst) || *dst < 1 || *dst > 100000)
        return train_usage_error("%s '%s' is not a whole number of steps from 1 to 100000", opt, v);
    } else if (strcmp(opt, "--precision") == 0) {
      if (fl_precision_parse(v, &o->precision) != FL_OK)
        return train_usage_error("--precision '%s' is not fp32, tf32, bf16 or fp16", v);
    } else if (strcmp(opt, "--clip-grad-norm") == 0) {
      if (!cli_parse_double(v, &o->clip_grad_norm) || !(o->clip_grad_norm > 0) || !isfinite(o->clip_grad_norm))
        return train_usage_error("--clip-grad-norm '%s' is not a number > 0", v);
    } else if (strcmp(opt, "--power") == 0) {
      if (!cli_parse_double(v, &o->decay_power) || !(o->decay_power > 0) || o->decay_power > 100)
        return train_usage_error("--power '%s' is not a number in (0, 100]", v);
    } else if (strcmp(opt, "--seed") == 0) {
      if (!cli_parse_u64(v, UINT64_MAX, &o->seed)) return train_usage_error("--seed '%s' is not a whole number", v);
    } else if (strcmp(opt, "--compress") == 0) {
      o->compress = v; /* checked with the other options, by the trainer */
    } else if (strcmp(opt, "--allreduce") == 0) {
      if (fl_allreduce_algo_parse(v, &o->allreduce) != FL_OK)
        return train_usage_error("%s", fl_last_error());
    } else if (strcmp(opt, "--bucket-mb") == 0) {
      if (!cli_parse_double(v, &d) || d <= 0 || d > 4096) return train_usage_error("--bucket-mb '%s' is not a number in (0, 4096]", v);
      o->bucket_bytes = (size_t)(d * 1048576);
      if (o->bucket_bytes < 4) o->bucket_bytes = 4;
    } else if (strcmp(opt, "--master") == 0) {
      o->master = v;
    } else if (strcmp(opt, "--csv") == 0) {
      o->csv_path = v;
    } else if (strcmp(opt, "--svg") == 0) {
      o->svg_path = v;
    } else if (strcmp(opt, "--checkpoint") == 0) {
      o->checkpoint_path = v;
    } else if (strcmp(opt, "--resume") == 0) {
      o->resume_path = v;
    } else if (strcmp(opt, "--plan") == 0) {
      if (strcmp(v, "auto") != 0) return train_usage_error("--plan '%s': the only plan is auto", v);
      o->plan_auto = true;
    } else if (strcmp(opt, "--world") == 0 || strcmp(opt, "--plan-max-microbatches") == 0) {
      uint32_t *dst = opt[2] == 'w' ? &o->plan_world : &o->plan_max_microbatches;
      if (!cli_parse_u32(v, dst) || *dst < 1 || *dst > 1024)
        return train_usage_error("%s '%s' is not a whole number from 1 to 1024", opt, v);
    } else if (strcmp(opt, "--plan-memory") == 0) {
      if (!cli_parse_double(v, &o->plan_memory_mb) || !(o->plan_memory_mb > 0) || o->plan_memory_mb > 1e9)
        return train_usage_error("--plan-memory '%s' is not a number of MiB in (0, 1e9]", v);
    }
    if (!grid_opt && (strcmp(opt, "--dp") == 0 || strcmp(opt, "--ranks") == 0 || strcmp(opt, "--tp") == 0 ||
                      strcmp(opt, "--pp") == 0 || strcmp(opt, "--microbatches") == 0 ||
                      strcmp(opt, "--schedule") == 0 || strcmp(opt, "--chunks") == 0))
      grid_opt = train_longopts[index].name;
  }
  if (o->plan_auto && grid_opt)
    return train_usage_error("--plan auto chooses --dp, --tp, --pp and --microbatches itself (1f1b, no --chunks, no "
                             "--recompute), but --%s was given: leave it out, or drop --plan auto", grid_opt);
  if (optind - 1 < argc) return train_usage_error("unexpected argument '%s'", argv[optind - 1]);
  /* --replicas names the stages: --pp need not repeat their number. */
  if (replica_stages && !pp_given) o->pp = replica_stages;
  /* auto:W: at most --pp stages, by default as many as the ranks and the model allow */
  if (o->replicas_auto && !pp_given) {
    uint32_t most = o->replicas_auto < o->blocks + 2 ? o->replicas_auto : o->blocks + 2;
    o->pp = most < GPU_TRAIN_MAX_STAGES ? most : GPU_TRAIN_MAX_STAGES;
  }
  if (!have_model) return train_usage_error("--model is required (mlp, cnn, resnet18, resnet50, transformer, gpt or FILE.so)");
  if (!have_data)
    return train_usage_error("--data is required (fashion-mnist, synthetic-imagenet, libsvm:PATH, csv:PATH, "
                             "idx:IMAGES,LABELS, imagefolder:DIR or text:PATH)");
  if (test_data && o->data < GPU_TRAIN_LIBSVM)
    return train_usage_error("--test-data is for --data libsvm:, csv: and idx: (and imagefolder:; %s has its own "
                             "test set)", gpu_train_dataset_name(o->data));
  if (test_data) {
    gpu_train_dataset kind;
    if (gpu_train_source_parse(test_data, &kind, &o->test_path) != FL_OK)
      return train_usage_error("--test-data: %s", fl_last_error());
    if (kind != o->data)
      return train_usage_error("--test-data %s is not in --data's format (%s:)", test_data,
                               gpu_train_dataset_name(o->data));
  }
  if (o->data_dir && o->data != GPU_TRAIN_FASHION_MNIST) return train_usage_error("--data-dir is for --data fashion-mnist");
  if (o->synthetic_train_images && o->data != GPU_TRAIN_SYNTHETIC_IMAGENET)
    return train_usage_error("--synthetic-images is for --data synthetic-imagenet");
  /* An option the chosen optimizer would ignore is a mistake worth saying. */
  optim_kind k = o->optim.kind;
  const char *kind = optim_kind_name(k);
  if (adam_opt && k != OPTIM_ADAM && k != OPTIM_ADAMW && k != OPTIM_LAMB)
    return train_usage_error("%s is for --optimizer adam, adamw or lamb (this run's is %s)", adam_opt, kind);
  if (lars_opt && k != OPTIM_LARS) return train_usage_error("%s is for --optimizer lars (this run's is %s)", lars_opt, kind);
  if (momentum_opt && k != OPTIM_SGD && k != OPTIM_LARS)
    return train_usage_error("%s is for --optimizer sgd or lars (this run's is %s)", momentum_opt, kind);
  if (eps_given && k != OPTIM_ADAM && k != OPTIM_ADAMW && k != OPTIM_LAMB && k != OPTIM_ADAGRAD)
    return train_usage_error("--eps is for --optimizer adam, adamw, lamb or adagrad (this run's is %s)", kind);
  bool ps = GPU_TRAIN_SYNC_IS_PS(o->sync);
  if (!ps && (o->ps_fetch || o->ps_push)) return train_usage_error("--ps-fetch and --ps-push are for --sync asp and ssp:S");
  /* The servers take plain SGD steps: without --momentum a parameter-server run has none
   * (an explicit one is refused by the trainer's check, which says why); their adagrad and
   * adam run at a fixed rate, so without --decay they have none. */
  if (ps && !momentum_opt && k == OPTIM_SGD) o->optim.momentum = 0;
  if (ps && !decay_given && k != OPTIM_SGD) o->decay = OPTIM_DECAY_NONE;
  /* The checks across options (batch and ranks, warmup and epochs, milestones) are the
   * trainer's own, so that C callers get the same ones. */
  if (gpu_train_options_validate(o) != FL_OK) return train_usage_error("%s", fl_last_error());
  return 0;
}

int cmd_train(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "compare") == 0) return cmd_train_compare(argc - 1, argv + 1);
  gpu_train_options o;
  int rc = parse_args(argc, argv, &o);
  if (rc == -2) return cli_print_version();
  if (rc < 0) {
    fputs(train_usage_text, stdout);
    return 0;
  }
  if (rc) return rc;
  optim_schedule sched;
  gpu_train_schedule(&o, &sched);
  bool hybrid = o.model == NN_TRANSFORMER;
  uint32_t world = gpu_train_world(&o);
  printf("training %s on %s: %u rank%s on %s, global batch %u (%u per rank), %s, lr %g x %u / 256 = %g, warmup %g "
         "epochs, %s decay, %u epochs\n",
         o.gpt ? "gpt" : nn_model_kind_name(o.model), gpu_train_dataset_name(o.data), world, world == 1 ? "" : "s",
         o.device == FL_DEVICE_CPU ? "cpu" : "cuda", o.batch, o.batch / world, optim_kind_name(o.optim.kind), o.lr,
         o.batch, optim_schedule_peak_lr(&sched), o.warmup_epochs, optim_decay_name(o.decay), o.epochs);
  if (o.plan_auto)
    printf("grid         chosen by --plan auto for %u ranks (below); hidden %u, %u heads, %u blocks, dropout %g\n", world,
           o.hidden, o.heads, o.blocks, o.dropout);
  else if (hybrid)
    printf("grid         dp %u x tp %u x pp %u, %s schedule, %u micro-batch%s of %u, %u chunk%s per stage rank%s; "
           "hidden %u, %u heads, %u blocks, dropout %g\n",
           o.ranks, o.tp, o.pp, pp_schedule_name(o.schedule), o.microbatches, o.microbatches == 1 ? "" : "es",
           o.batch / o.ranks / o.microbatches, o.chunks, o.chunks == 1 ? "" : "s", o.recompute ? ", recompute" : "",
           o.hidden, o.heads, o.blocks, o.dropout);
  if (hybrid && o.replicas_auto)
    printf("replicas     auto: PipeDream's partitioner over %u ranks a pipeline, at most %u stages\n", o.replicas_auto,
           o.pp);
  if (hybrid && o.replicas[0]) {
    printf("replicas    ");
    for (uint32_t s = 0; s < o.pp; s++) printf(" stage %u: %u%s", s, o.replicas[s], s + 1 < o.pp ? "," : "");
    printf(" (1F1B-RR: micro-batch i on replica i mod r; %u ranks a pipeline)\n", world / o.ranks);
  }
  if (o.trick)
    printf("trick        convolutions data parallel on %u images a rank; FC layers split %u ways over the "
           "global batch\n", o.batch / world, world);
  if (hybrid && o.experts) {
    uint32_t top_k, every;
    float cf, alpha;
    gpu_train_experts(&o, &top_k, &every, &cf, &alpha);
    char which[48];
    if (every == 1) snprintf(which, sizeof which, "every block");
    else if (every == 2) snprintf(which, sizeof which, "every other block");
    else snprintf(which, sizeof which, "every %u-th block", every);
    printf("experts      %u in %s (%u a data-parallel rank), top-%u, capacity factor %g, balancing loss alpha "
           "%g\n", o.experts, which, o.experts / o.ranks, top_k, cf, alpha);
  }
  if (hybrid && (o.sequence_parallel || o.recompute_selective))
    printf("activations  %s%s%s\n", o.sequence_parallel ? "sequence parallel" : "",
           o.sequence_parallel && o.recompute_selective ? ", " : "",
           o.recompute_selective ? "selective recomputation" : "");
  if (o.accumulate > 1)
    printf("accumulate   %u micro-batches of %u per rank a step, one allreduce after the last\n", o.accumulate,
           o.batch / world / o.accumulate);
  fflush(stdout);
  gpu_train_result res;
  if (gpu_train_run(&o, &res) != FL_OK) {
    return cli_failure("train", "%s", fl_last_error());
  }
  printf("epochs       %u (%llu steps, %u attempt%s", res.epochs, (unsigned long long)res.steps, res.attempts,
         res.attempts == 1 ? "" : "s");
  if (res.resumed_epoch && !o.resume_path) printf(", the last resumed after epoch %u", res.resumed_epoch);
  printf(")\n");
  if (o.resume_path) printf("resumed      %s after epoch %u\n", o.resume_path, res.resumed_epoch);
  if (o.gpt) { /* per byte: the loss in nats and in bits, and the next byte's accuracy */
    printf("train        loss %.4f per byte (%.3f bits per byte)  next-byte accuracy %.4f\n", res.train_loss,
           res.train_loss / M_LN2, res.train_acc);
    printf("test         loss %.4f per byte (%.3f bits per byte)  next-byte accuracy %.4f\n", res.test_loss,
           res.test_loss / M_LN2, res.test_acc);
  } else {
    printf("train        loss %.4f  accuracy %.4f\n", res.train_loss, res.train_acc);
    printf("test         loss %.4f  accuracy %.4f\n", res.test_loss, res.test_acc);
  }
  printf("throughput   %.0f images/s over %.1f s", res.images_per_s, res.seconds);
  bool ps = GPU_TRAIN_SYNC_IS_PS(o.sync);
  if (!hybrid && !ps && !o.trick) printf("; input wait %.1f%% of the steps' time", 100 * res.input_wait_share);
  printf("\n");
  if (o.compress && res.steps)
    printf("compress     %s: %.1f KiB sent a step by a rank (%.1f KiB of gradients, %.1fx less)\n", o.compress,
           (double)res.sent_bytes / res.steps / 1024, (double)res.reduced_bytes / res.steps / 1024,
           res.sent_bytes ? (double)res.reduced_bytes / res.sent_bytes : 0.0);
  if (o.trick && res.steps)
    printf("trick        %.1f KiB sent a step by a rank, %.1f KiB of them the convolutions' gradients (ring "
           "counts; bench_trick compares data parallelism)\n",
           (double)res.sent_bytes / res.steps / 1024, (double)res.reduced_bytes / res.steps / 1024);
  if (ps)
    printf("servers      %.1f MiB pushed and pulled by a worker; pulls at most %llu steps behind; %u worker%s "
           "retried and resumed\n", (double)res.reduced_bytes / (1 << 20), (unsigned long long)res.max_staleness,
           res.resumed_workers, res.resumed_workers == 1 ? "" : "s");
  if (hybrid && o.experts)
    printf("moe          balancing loss %.4g (not in the loss above), %.2f%% of the expert choices dropped over "
           "capacity (the last epoch's means)\n", res.aux_loss, 100 * res.dropped_fraction);
  if (hybrid) {
    if (o.replicas_auto) {
      printf("replicas    ");
      for (uint32_t s = 0; s < res.stages && s < GPU_TRAIN_MAX_STAGES; s++)
        printf(" stage %u: %u%s", s, res.stage_replicas[s], s + 1 < res.stages ? "," : "");
      printf(" (the partitioner's choice)\n");
    }
    printf("bubble       %.3f measured (the last epoch's mean), %.3f in theory\n", res.bubble, res.bubble_theory);
    if (res.link_bytes_per_s > 0)
      printf("link         %.2f GB/s between stages, measured for the partitioner\n", res.link_bytes_per_s / 1e9);
    printf("activations  peak per stage:");
    for (uint32_t p = 0; p < res.stages && p < GPU_TRAIN_MAX_STAGES; p++)
      printf(" %.1f KiB", (double)res.stage_peak_bytes[p] / 1024.0);
    printf("\n");
    if (o.plan_auto && res.images_per_s > 0) {
      double measured = o.batch / res.images_per_s;
      printf("plan         dp %u x tp %u x pp %u, m %u: predicted %.2f ms a step, measured %.2f ms (%.2fx the "
             "prediction)\n", res.plan_dp, res.plan_tp, res.plan_pp, res.plan_microbatches, res.plan_step_s * 1e3,
             measured * 1e3, res.plan_step_s > 0 ? measured / res.plan_step_s : 0.0);
    }
    if (o.timeline_csv_path) printf("timeline     %s\n", o.timeline_csv_path);
    if (o.timeline_svg_path) printf("timeline     %s\n", o.timeline_svg_path);
  }
  if (o.csv_path) printf("curves       %s\n", o.csv_path);
  if (o.svg_path) printf("plot         %s\n", o.svg_path);
  if (o.checkpoint_path) printf("checkpoint   %s\n", o.checkpoint_path);
  fflush(stdout);
  return 0;
}
