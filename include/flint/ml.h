/*
 * flint/ml.h: batch-convex solvers on flint (libflint_ml).
 *
 * ml/ is built on flint's public API only, as MLlib on Spark core, plus OpenBLAS and LAPACKE
 * on whole row blocks. Its task functions live in libflint_ml.so and travel to executors
 * like any user library.
 *
 * Data is a dataset of row blocks: one record holds up to rows_per_block rows (labels,
 * optional sample weights, and float64 features, dense row-major or CSR), so kernels run
 * BLAS on whole blocks and a cached dataset holds about the raw bytes. A solver evaluates
 * its objective as one dataflow stage of many small tasks over the cached blocks (the
 * Sandblaster pattern): the weights go out as a broadcast, each task computes loss and
 * gradient over its blocks in one fused pass, and the parts come back through
 * fl_tree_aggregate; speculation (FLINT_SPECULATION=1) covers stragglers.
 *
 * Every call returns fl_status; fl_last_error() names the cause (file and line of bad input,
 * a singular system, an unknown option).
 */
#ifndef FLINT_ML_H
#define FLINT_ML_H

#include <flint/flint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FLINT_ML_BUILDING)
#define FL_ML_API __attribute__((visibility("default")))
#else
#define FL_ML_API
#endif

/* ---- row blocks ------------------------------------------------------------------------ */

/* A view of one block record. Dense: x holds rows x cols values, row-major. Sparse (CSR):
 * row i's values are x[row_ptr[i] .. row_ptr[i+1]) at columns col[...] (0-based, strictly
 * ascending within a row); cols is the block's width (its largest column + 1 at least). */
typedef struct fl_ml_block {
  uint32_t rows, cols;
  bool sparse;
  const double *labels;    /* rows */
  const double *weights;   /* rows, or NULL: every weight is 1 */
  const double *x;         /* dense: rows * cols; sparse: nnz */
  const uint64_t *row_ptr; /* sparse: rows + 1 */
  const uint32_t *col;     /* sparse: nnz */
  uint64_t nnz;            /* sparse: the number of stored values */
} fl_ml_block;

/* Reads a block record. The arrays point into `rec` when it is 8-byte aligned (blocks are
 * laid out so that they are, in cached partitions), else into a copy in `scratch` (owned by
 * the caller, reused across calls). A malformed record is FL_ECORRUPT. */
FL_ML_API fl_status fl_ml_block_view(fl_bytes rec, fl_buf *scratch, fl_ml_block *out);

/* Collects rows and emits them as block records of up to rows_per_block rows. */
typedef struct fl_ml_block_builder fl_ml_block_builder;
/* cols: dense width (every dense row has it); for sparse rows the widest row sets the
 * block's width and `cols` is a lower bound (0 is fine). rows_per_block 0: about 1 MiB of
 * features per block. weighted: rows carry sample weights. */
FL_ML_API fl_status fl_ml_block_builder_create(uint32_t cols, bool sparse, bool weighted,
                                               uint32_t rows_per_block, fl_ml_block_builder **out);
FL_ML_API fl_status fl_ml_block_builder_add_dense(fl_ml_block_builder *b, double label,
                                                  double weight, const double *x);
/* idx strictly ascending, 0-based. */
FL_ML_API fl_status fl_ml_block_builder_add_sparse(fl_ml_block_builder *b, double label,
                                                   double weight, const uint32_t *idx,
                                                   const double *values, uint32_t nnz);
/* Rows added since the last emit. */
FL_ML_API uint32_t fl_ml_block_builder_rows(const fl_ml_block_builder *b);
/* True when the next row would not fit: emit first. */
FL_ML_API bool fl_ml_block_builder_full(const fl_ml_block_builder *b);
/* Encodes the rows collected so far as one block record into `out` (replacing its
 * contents) and starts a new block. No rows: out->len = 0. */
FL_ML_API fl_status fl_ml_block_builder_take(fl_ml_block_builder *b, fl_buf *out);
FL_ML_API void fl_ml_block_builder_free(fl_ml_block_builder *b);

/* A dataset of row blocks with what solvers need to know about it. */
typedef struct fl_ml_data {
  fl_dataset *blocks; /* owned; persisted in memory unless the caller changed it */
  uint64_t rows;
  uint32_t cols;
  bool sparse, weighted;
  uint64_t skipped; /* bad input lines skipped (only when the loader was asked to) */
  /* the labels' range, found with the shape: classification checks them without a job */
  double label_min, label_max;
  bool labels_integer;
  /* Which labels occur, found with the shape when every label is an integer in -1..65535
   * (the labels classification accepts): bit y + 1 of label_seen (FL_ML_LABEL_WORDS words,
   * owned, freed by fl_ml_data_free) is set when some row has label y, and label_count is
   * the number of distinct labels. NULL and 0 otherwise, and for data not described by
   * flint (then fl_ml_logreg cannot check for classes with no rows). */
  uint32_t label_count;
  uint64_t *label_seen;
} fl_ml_data;
#define FL_ML_LABEL_WORDS 1025 /* 65537 bits: labels -1..65535 */
FL_ML_API void fl_ml_data_free(fl_ml_data *data);
/* Writes what the data's labels are into buf (NUL-terminated, cut to len): "3 label values:
 * 1..2, 5", or "labels from 0.5 to 2.25, not all integers" where label_seen is NULL. */
FL_ML_API void fl_ml_data_describe_labels(const fl_ml_data *data, char *buf, size_t len);
/* Wraps a dataset of block records (made with fl_ml_block_builder, e.g. in a map_partitions
 * or on the client and fl_parallelize'd): persists it in memory and runs one job for its
 * rows, width, sparsity, weights and label range. cols: the feature count when sparse rows
 * may not reach the last feature (0: the widest block's). On success *out owns `blocks`; on
 * failure the caller keeps it. A record that is not a block is FL_ECORRUPT. */
FL_ML_API fl_status fl_ml_data_from_blocks(fl_dataset *blocks, uint32_t cols, fl_ml_data **out);

/* ---- loaders --------------------------------------------------------------------------- */
/* TEXT: "LABEL TOKEN TOKEN ...", blank-separated; each token (a word, "field=value") is a
 * feature of value 1, repeats adding up, hashed into 2^hash_bits columns (which it needs). */
typedef enum fl_ml_format { FL_ML_LIBSVM, FL_ML_CSV, FL_ML_IDX, FL_ML_TEXT } fl_ml_format;

typedef struct fl_ml_load_options {
  uint32_t partitions;     /* 0: 4 per core of the context */
  uint32_t rows_per_block; /* 0: about 1 MiB of features per block */
  /* LIBSVM: indices are 1-based; an index 0 is an error naming file and line unless
   * zero_based is set. num_features 0: the largest index seen. */
  bool zero_based;
  uint32_t num_features;
  /* CSV: the label's column (0-based; -1: the last; note that 0, the zero-initialised
   * default, is the first), a header line to skip, the delimiter (0: ','). */
  int label_column;
  bool header;
  char delimiter;
  /* IDX: path is the images file (idx3-ubyte, optionally .gz), labels_path the labels file
   * (idx1-ubyte, optionally .gz; required); pixels are multiplied by pixel_scale (0: 1/255),
   * labels are the classes as doubles. rows_per_block 0 also caps blocks so that every
   * partition gets one. */
  const char *labels_path;
  double pixel_scale;
  /* Bad lines are an error naming file, line and cause; with skip_bad_lines they are
   * counted in fl_ml_data.skipped (and the first one logged to stderr) instead. */
  bool skip_bad_lines;
  /* LIBSVM and TEXT: the hashing trick (Weinberger et al.; scikit-learn's FeatureHasher,
   * Vowpal Wabbit): each feature goes to column h(feature) mod 2^hash_bits with the sign of
   * another bit of h, and features that meet in a column add up. The rows are sparse and
   * 2^hash_bits wide whatever the input's indices; num_features must be 0. 0: no hashing
   * (TEXT needs it); 1 to 31. */
  uint32_t hash_bits;
} fl_ml_load_options;

/* Loads `path` into cached row blocks. opt may be NULL (defaults). On success *out is a
 * malloc'd fl_ml_data (free it with fl_ml_data_free) whose blocks are persisted in memory and
 * already computed (rows, cols, sparse and weighted come from one job over them).
 *
 * LIBSVM and CSV: path is a file, a folder (its visible files, sorted) or a glob, as for
 * fl_text_file; each file is read by the executors and its lines are numbered from 1 in that
 * file. Blank lines are ignored; LIBSVM lines may end in a "# comment". CSV fields are plain
 * numbers (no quoting), blanks around them allowed; every line has the first data line's
 * field count, and with header the first line of every file is skipped. Two jobs run
 * before the parse: one counts the lines of each partition, and for CSV one reads the first
 * data line. The blocks have at most opt->partitions partitions (fewer where the input has
 * fewer splits, as .gz files, which are one split each).
 * IDX: the calling process checks both headers and the labels; each partition's task then
 * reads its range of images from the file (so, as for text files, the path must be readable
 * where the executors run; .gz files are decompressed up to the range).
 *
 * Errors: FL_EINVAL for NULL arguments, an unknown format or bad options; FL_ENOENT for a
 * missing input file; FL_EFORMAT for malformed input, naming the file and the line ("x.csv:7:
 * expected 5 fields, found 4"; the first bad line of the input, whichever task found it) or,
 * for IDX, the file and the image; FL_EEMPTY when no rows are left; a failed job's status.
 * With skip_bad_lines, bad lines are counted in skipped and, when there are any, one line
 * names their count and the first of them on stderr. */
FL_ML_API fl_status fl_ml_load(fl_context *ctx, const char *path, fl_ml_format format,
                               const fl_ml_load_options *opt, fl_ml_data **out);
/* Parses "libsvm", "csv", "idx" or "text". */
FL_ML_API fl_status fl_ml_format_parse(const char *name, fl_ml_format *out);

/* ---- IDX files ---------------------------------------------------------------------------
 * The format of MNIST and Fashion-MNIST: a big-endian u32 magic, one big-endian u32 size per
 * dimension, then one unsigned byte per element; gzip'd or not (a file named .gz must hold
 * gzip data). fl_ml_load reads IDX with these calls, and so do libflint_gpu's image data sets.
 * Every error names the file. A reader is used by one thread at a time. */
#define FL_ML_IDX_IMAGES 0x00000803u /* idx3-ubyte: count, rows, cols */
#define FL_ML_IDX_LABELS 0x00000801u /* idx1-ubyte: count */
typedef struct fl_ml_idx fl_ml_idx;
/* Opens `path`, which must start with `magic` (FL_ML_IDX_IMAGES or FL_ML_IDX_LABELS), and
 * reads its sizes into dims (3 for images, 1 for labels). FL_ENOENT or FL_EIO when it cannot
 * be opened; FL_ECORRUPT for a .gz name over data that is not gzip; FL_EFORMAT for another
 * magic or a header cut short. */
FL_ML_API fl_status fl_ml_idx_open(const char *path, uint32_t magic, uint32_t *dims, fl_ml_idx **out);
/* Reads up to len bytes of elements; *got is less than len only at the end of the data. FL_EIO
 * for a read error, FL_ECORRUPT for gzip data that is corrupt or cut short (naming the byte of
 * the file where it ends). */
FL_ML_API fl_status fl_ml_idx_read(fl_ml_idx *f, void *buf, size_t len, size_t *got);
/* Positions the next read at item `index` (an image of rows x cols bytes, or a label). Going
 * forward is cheap; a .gz file seeks by reading. FL_EFORMAT when it cannot. */
FL_ML_API fl_status fl_ml_idx_seek(fl_ml_idx *f, uint64_t index);
/* FL_OK when no byte follows; FL_EFORMAT "PATH: trailing bytes after <what>" otherwise. */
FL_ML_API fl_status fl_ml_idx_expect_end(fl_ml_idx *f, const char *what);
/* Closes the file; NULL does nothing. */
FL_ML_API void fl_ml_idx_close(fl_ml_idx *f);
/* A labels file whole: appends its labels (one byte each) to `labels`, read in pieces so that
 * a corrupt count allocates no more than the file holds, and checks that nothing follows.
 * FL_EFORMAT for a file cut short or trailing bytes, as well as fl_ml_idx_open's errors. */
FL_ML_API fl_status fl_ml_idx_read_labels(const char *path, fl_buf *labels);

/* Seeded synthetic data, made on the executors (no data travels): rows x cols standard
 * normal features; for FL_ML_SYNTH_LINEAR labels x.w + 0.5 + noise N(0, noise^2) with
 * w ~ N(0, 1), for FL_ML_SYNTH_LOGISTIC labels drawn from the logistic (classes 2) or
 * softmax model with weights w ~ N(0, 4/cols) (margins of standard deviation about 2) and
 * intercepts N(0, 1/16). Same seed: same data, whatever the partition count. */
typedef enum fl_ml_synth_kind { FL_ML_SYNTH_LINEAR, FL_ML_SYNTH_LOGISTIC } fl_ml_synth_kind;
typedef struct fl_ml_synth_options {
  fl_ml_synth_kind kind;
  uint64_t rows;
  uint32_t cols;
  uint32_t classes; /* logistic: 2 or more */
  double noise;     /* linear: label noise sd */
  uint64_t seed;
  uint32_t partitions, rows_per_block; /* 0: as fl_ml_load_options */
} fl_ml_synth_options;
FL_ML_API fl_status fl_ml_synthetic(fl_context *ctx, const fl_ml_synth_options *opt, fl_ml_data **out);

/* ---- summary statistics and standardization -------------------------------------------- */
typedef struct fl_ml_summary {
  uint64_t count;
  double weight_sum;
  uint32_t cols;
  double *mean, *variance, *min, *max; /* cols each (unbiased weighted variance) */
  double label_min, label_max;
} fl_ml_summary;
/* One fl_tree_aggregate over the blocks. */
FL_ML_API fl_status fl_ml_summarize(const fl_ml_data *data, fl_ml_summary *out);
FL_ML_API void fl_ml_summary_free(fl_ml_summary *s);
/* A new cached dataset with x_j -> (x_j - mean_j) / sd_j (with_mean is refused for sparse
 * data; columns with sd 0 are left unscaled). */
FL_ML_API fl_status fl_ml_standardize(const fl_ml_data *data, const fl_ml_summary *s, bool with_mean,
                                      fl_ml_data **out);

/* ---- optimizers (on the driver) -------------------------------------------------------- */

/* The objective: loss and gradient of the smooth part at w (n values). fraction < 1 asks
 * for a mini-batch estimate over about that fraction of the rows, chosen by seed. */
typedef fl_status (*fl_ml_objective_fn)(void *arg, const double *w, double fraction, uint64_t seed,
                                        double *loss, double *grad);

typedef enum fl_ml_method { FL_ML_LBFGS, FL_ML_GD } fl_ml_method;

typedef struct fl_ml_iteration {
  uint32_t iteration;   /* 1, 2, ... */
  double loss;          /* objective including the L1 term */
  double grad_norm;     /* of the (pseudo-)gradient, L2 */
  double step;          /* the accepted step length */
  uint32_t evaluations; /* objective evaluations so far */
  double seconds;       /* since the start */
} fl_ml_iteration;

typedef struct fl_ml_optim_options {
  fl_ml_method method;
  uint32_t max_iterations; /* 0: 100 */
  double tol;              /* stop when grad_norm <= tol (0: 1e-6) */
  uint32_t history;        /* L-BFGS memory m (0: 10) */
  double l1;               /* > 0: L1 penalty l1 * sum |w_i| over penalized i (OWL-QN with
                              L-BFGS, proximal steps with GD) */
  const bool *l1_skip;     /* n flags, or NULL: true leaves w_i out of the L1 term (intercepts) */
  double step;             /* GD: the first step length (0: 1); backtracking halves it */
  double fraction;         /* GD: mini-batch fraction (0 or 1: full batch); mini-batches take
                              no line search, step / sqrt(t) at iteration t, and loss,
                              grad_norm and the stopping test are mini-batch estimates.
                              L-BFGS ignores fraction, seed and step (full batch, seed 0) */
  uint64_t seed;           /* GD mini-batches: iteration t uses seed + t (the start: seed) */
  /* Called after each iteration, with w holding that iteration's point; a non-FL_OK
   * return stops with that status. */
  fl_status (*progress)(void *arg, const fl_ml_iteration *it);
  void *progress_arg;
} fl_ml_optim_options;

typedef struct fl_ml_optim_result {
  uint32_t iterations, evaluations;
  bool converged; /* grad_norm <= tol */
  double loss, grad_norm;
  fl_ml_iteration *history; /* one per iteration; free with fl_ml_optim_result_free */
  uint32_t num_history;
} fl_ml_optim_result;

/* Minimizes f + l1 * |w|_1 from w (n values, overwritten with the result). opt may be NULL
 * (defaults: L-BFGS). A line search that finds no acceptable step (strong Wolfe for L-BFGS)
 * ends the run (converged false) with the best point so far; an error from f or from
 * progress is returned as is, with w the last accepted point. A start point where f's
 * value or gradient is not finite is FL_EINVAL. `out` is reset first and holds the run so
 * far after any return: free it with fl_ml_optim_result_free. */
FL_ML_API fl_status fl_ml_minimize(uint32_t n, double *w, fl_ml_objective_fn f, void *arg,
                                   const fl_ml_optim_options *opt, fl_ml_optim_result *out);
/* Frees r's history and zeroes *r; NULL or a zeroed result is fine. */
FL_ML_API void fl_ml_optim_result_free(fl_ml_optim_result *r);

/* ---- models ---------------------------------------------------------------------------- */
typedef enum fl_ml_model_kind {
  FL_ML_LINEAR,             /* y = x.w + b */
  FL_ML_LOGISTIC_BINARY,    /* P(y = 1) = sigmoid(x.w + b); labels 0/1 (or -1/+1) */
  FL_ML_LOGISTIC_MULTINOMIAL /* P(y = k) = softmax(W x + b)_k; labels 0 .. classes-1 */
} fl_ml_model_kind;

typedef struct fl_ml_model {
  fl_ml_model_kind kind;
  uint32_t cols;    /* features */
  uint32_t classes; /* 1 for linear, 2 for binary, K for multinomial */
  uint32_t outputs; /* rows of coef: 1, 1 or K */
  bool intercept;
  double *coef;      /* outputs x cols, row-major */
  double *intercepts;/* outputs */
  /* the run that made it */
  fl_ml_iteration *history;
  uint32_t num_history;
  bool converged;
  double train_seconds;
} fl_ml_model;

FL_ML_API void fl_ml_model_free(fl_ml_model *m);
/* One row: linear: the prediction; logistic: the most likely class; probs (classes values,
 * may be NULL) gets each class's probability. x has m->cols values. */
FL_ML_API double fl_ml_predict(const fl_ml_model *m, const double *x, double *probs);
/* Writes the model as text (docs/ml.md: "Model files"); reads one back. */
FL_ML_API fl_status fl_ml_model_save(const fl_ml_model *m, const char *path);
FL_ML_API fl_status fl_ml_model_load(const char *path, fl_ml_model **out);

typedef struct fl_ml_metrics {
  uint64_t rows;
  double weight_sum;
  /* linear */
  double rmse, r2;
  /* logistic */
  double accuracy, log_loss;
  double auc; /* binary only (else NaN), from a 4096-bin score histogram */
} fl_ml_metrics;
/* The prediction of every row of `data` (fl_ml_predict's value: linear, the value; logistic,
 * the class), in row order: *out becomes data->rows 8-byte doubles (its old contents
 * replaced; the caller owns it and frees it with fl_buf_free). One job, whose results come to the caller:
 * 8 bytes a row. FL_EINVAL when the data has more features than the model. */
FL_ML_API fl_status fl_ml_predict_data(const fl_ml_model *m, const fl_ml_data *data, fl_buf *out);
/* One pass over `data`. */
FL_ML_API fl_status fl_ml_evaluate(const fl_ml_model *m, const fl_ml_data *data, fl_ml_metrics *out);

/* The training objective at the model's parameters and its gradient (outputs x (cols + 1)
 * values: coefficients, then intercepts): linear (1/2W) sum w_i r_i^2 + (l2/2W)|w|^2,
 * logistic (1/W) sum w_i logloss_i + (l2/2)|w|^2 (no L1 term). One pass. */
FL_ML_API fl_status fl_ml_loss_gradient(const fl_ml_model *m, const fl_ml_data *data, double l2, double *loss,
                                        double *grad);

/* ---- solvers --------------------------------------------------------------------------- */
/* SANDBLASTER: L-BFGS whose vectors (the weights, gradients, direction and the m history
 * pairs) are columns of one parameter-server table (flint/ps.h) and whose vector work runs
 * on its shards; each gradient evaluation is a job of one task per partition that pulls the
 * trial weights and adds its partial gradient into the table, once per evaluation however
 * often speculation or retries run it. Smooth objectives only (l1 must be 0); the vectors
 * are float32 on the servers, so the optimum matches lbfgs's to about 1e-5, not to the last
 * bit (docs/ml.md).
 * PS: binary logistic regression by asynchronous minibatch SGD through parameter-server
 * tables (flint/ps.h), as Li et al.'s OSDI'14 sparse logistic regression; see
 * fl_ml_ps_options and docs/ml.md. */
typedef enum fl_ml_solver {
  FL_ML_SOLVER_AUTO,
  FL_ML_SOLVER_NORMAL,
  FL_ML_SOLVER_LBFGS,
  FL_ML_SOLVER_GD,
  FL_ML_SOLVER_SANDBLASTER,
  FL_ML_SOLVER_PS,
} fl_ml_solver;
FL_ML_API fl_status fl_ml_solver_parse(const char *name, fl_ml_solver *out);

/* The consistency model of the ps solver's workers: BSP (every worker waits for the others
 * each step: SSP with staleness 0, waited on the servers), SSP (a worker more than
 * `staleness` steps ahead of the slowest waits) or ASP (Downpour: nobody waits). */
typedef enum fl_ml_sync { FL_ML_SYNC_BSP = 0, FL_ML_SYNC_SSP, FL_ML_SYNC_ASP } fl_ml_sync;
/* Parses "bsp", "asp" or "ssp:S" (S a whole number from 0 to 1000000; ssp:0 is BSP). */
FL_ML_API fl_status fl_ml_sync_parse(const char *text, fl_ml_sync *sync, uint32_t *staleness);
/* The servers' update rule for the pushed gradients (flint/ps.h's): Adagrad (the default,
 * Downpour's), plain SGD or Adam. */
typedef enum fl_ml_ps_update { FL_ML_PS_ADAGRAD = 0, FL_ML_PS_SGD, FL_ML_PS_ADAM } fl_ml_ps_update;
/* Parses "adagrad", "sgd" or "adam". */
FL_ML_API fl_status fl_ml_ps_update_parse(const char *name, fl_ml_ps_update *out);

/* One row of the ps solver's curves, taken each time the workers together have done another
 * epoch's worth of steps (every partition's rows once): the objective and accuracy of the
 * weights on the servers at that moment over the evaluation rows (all training rows up to
 * eval_rows, else a sample of about eval_rows spread over the partitions), the seconds since
 * training began and the workers' bytes to and from the servers so far. */
typedef struct fl_ml_ps_epoch {
  uint32_t epoch;
  double loss, accuracy; /* mean log-loss + (l2 / 2)|w|^2 over the evaluation rows' keys */
  double seconds;
  uint64_t steps;        /* minibatch steps of all workers so far */
  uint64_t bytes_sent, bytes_received;
} fl_ml_ps_epoch;

/* The ps solver's options; zero is each one's default. */
typedef struct fl_ml_ps_options {
  fl_ml_sync sync;         /* BSP by default */
  uint32_t staleness;      /* SSP's bound */
  uint32_t epochs;         /* passes over the data (0: 10) */
  uint32_t batch;          /* rows a worker's step takes (0: 100): each worker splits its
                              partition into ceil(rows / (workers x batch)) steps an epoch */
  uint32_t fetch_every;    /* n_fetch: pull every this many steps the keys of that many
                              minibatches (0: 1) */
  uint32_t push_every;     /* n_push: push the gradients summed over this many steps (0: 1) */
  fl_ml_ps_update update;
  double lr;               /* the update's learning rate (0: 0.1) */
  uint32_t eval_rows;      /* rows the curves are measured on (0: 20000) */
  /* Called on the calling thread for each curve row; a non-FL_OK return stops training
   * with that status (the workers are stopped by fl_cancel_jobs, which cancels every job
   * of the context). */
  fl_status (*on_epoch)(void *arg, const fl_ml_ps_epoch *e);
  void *on_epoch_arg;
  /* Test only: worker fail_worker - 1 fails its task (FL_EIO) as it reaches step fail_step,
   * unless its attempt began at that step or later (a retried task goes on). 0: never. */
  uint32_t fail_worker, fail_step;
} fl_ml_ps_options;

typedef struct fl_ml_train_options {
  fl_ml_solver solver;     /* AUTO: linreg normal equations up to normal_max_features, else
                              L-BFGS; logreg L-BFGS */
  double l2;               /* lambda: (l2 / 2) |w|^2, intercepts not penalized */
  double l1;               /* > 0: OWL-QN (L-BFGS) or proximal GD */
  bool no_intercept;
  uint32_t max_iterations; /* 0: 100 */
  double tol;              /* gradient norm (0: 1e-6) */
  uint32_t history;        /* L-BFGS m (0: 10) */
  double step, fraction;   /* GD */
  uint64_t seed;
  uint32_t normal_max_features; /* 0: 4096 */
  /* logreg: 0 = from the labels (max + 1, 2 means binary; -1/+1 is binary too), and then
   * every class 0..max (or -1 and +1) must have rows: a label set such as {1, 2, 5} is
   * FL_EINVAL naming the empty labels and the classes found. K > 0 states the class count:
   * labels must lie in 0..K-1 (0/1 or -1/+1 for K = 2) and classes may have no rows. */
  uint32_t classes;
  uint32_t tree_depth;     /* gradients' fl_tree_aggregate depth (0: 1 up to 32 partitions, else 2) */
  fl_status (*progress)(void *arg, const fl_ml_iteration *it);
  void *progress_arg;
  /* solver PS: the workers' options (ignored by the other solvers). The PS solver refuses
   * l1, fraction, step, history and max_iterations, which are the batch solvers'. */
  fl_ml_ps_options ps;
} fl_ml_train_options;

/* Least squares. solver NORMAL: one pass of sufficient statistics (X'X by dsyrk per block,
 * X'y, y'y, n, column sums), then Cholesky of (X'X + l2 I) w = X'y on the driver; a
 * singular system is FL_EINVAL naming the cause. The loss minimized by L-BFGS/GD is
 * (1 / 2W) sum w_i (y_i - x_i.w - b)^2 + (l2 / 2) |w|^2, whose optimum is the same. */
FL_ML_API fl_status fl_ml_linreg(const fl_ml_data *data, const fl_ml_train_options *opt, fl_ml_model **out);
/* Logistic regression: (1 / W) sum w_i logloss_i + (l2 / 2) |w|^2 + l1 |w|_1.
 * Solver PS (two classes only): the weights (key j for feature j, key cols for the
 * intercept) live in a sparse parameter-server table made on the data's context; one worker
 * task per partition (the data is coalesced to the context's task slots first, since every
 * worker must run at once) runs all epochs, pulling its minibatches' keys and pushing their
 * gradients, and the calling thread takes a curve row (fl_ml_ps_options.on_epoch, and one
 * history entry, whose iteration is the epoch) each epoch. The returned model holds every
 * weight, pulled from the servers at the end (keys never pushed are 0); its
 * num_history rows are the curve's. Sample weights are honoured in the gradients. */
FL_ML_API fl_status fl_ml_logreg(const fl_ml_data *data, const fl_ml_train_options *opt, fl_ml_model **out);

#ifdef __cplusplus
}
#endif
#endif
