/*
 * cli/shell.c: flint shell [--master M]: a prompt where the user types C against a live
 * context `ctx`. Each input is compiled and run by cli/shell_session.c (its opening comment
 * gives the design); this file opens the context, reads inputs and runs the ':' commands.
 *
 * An input is complete when its brackets balance outside strings and comments: until then
 * the shell reads more lines ("   ...> "). On a terminal it reads with libedit (line
 * editing, history kept in ~/.flint_shell_history) when flint was built with it; otherwise,
 * and when stdin is not a terminal, with fgets.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FLINT_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "cli/cli.h"
#include "cli/shell.h"
#include "flint/flint.h"

/* The shell contains task crashes (fl_options.contain_task_crashes), whose tasks' memory is
 * leaked on purpose: LeakSanitizer (the sanitizer build) reads its default suppressions from
 * this hook, in the program that links it. */
const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void) {
  return "leak:common_crash_guard_run\n";
}

#define PROMPT "flint> "
#define PROMPT_MORE "   ...> "

static const char shell_help[] =
    "Type C: statements run at once against `ctx` (the session's fl_context *);\n"
    "`TYPE NAME = EXPR;` alone makes a variable that later inputs can use;\n"
    "functions, #include/#define and struct/typedef definitions stay defined.\n"
    "An input goes on over several lines until its brackets balance.\n"
    "\n"
    "commands:\n"
    "  :help        this text\n"
    "  :load FILE   runs a C file's items one by one, as if typed, up to the first that\n"
    "               fails (messages give the file's own line numbers)\n"
    "  :type EXPR   the type of an expression\n"
    "  :list        the variables and functions defined so far\n"
    "  :quit        frees the session's datasets, closes the context and exits (also Ctrl-D)\n"
    "Ctrl-C while an input runs cancels its jobs; at the prompt it ends the shell.\n";

/* ---- reading ---------------------------------------------------------------------------- */

typedef struct line_reader {
  bool edit; /* libedit on a terminal */
  char history[4096];
} line_reader;

/* Returns the next line without its newline (the caller frees it), or NULL at the end. */
static char *read_line(line_reader *r, const char *prompt) {
#ifdef FLINT_HAVE_LIBEDIT
  if (r->edit) {
    char *line = readline(prompt);
    if (line && *line) add_history(line);
    return line;
  }
#endif
  if (isatty(STDIN_FILENO)) {
    fputs(prompt, stdout);
    fflush(stdout);
  }
  size_t cap = 256, len = 0;
  char *line = malloc(cap);
  if (!line) return NULL;
  for (;;) {
    if (!fgets(line + len, (int)(cap - len), stdin)) {
      if (len) break;
      free(line);
      return NULL;
    }
    len += strlen(line + len);
    if (len && line[len - 1] == '\n') {
      line[--len] = '\0';
      break;
    }
    char *more = realloc(line, cap *= 2);
    if (!more) {
      free(line);
      return NULL;
    }
    line = more;
  }
  return line;
}

static void reader_start(line_reader *r) {
  r->edit = false;
#ifdef FLINT_HAVE_LIBEDIT
  if (isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)) {
    r->edit = true;
    const char *home = getenv("HOME");
    if (home && *home) {
      snprintf(r->history, sizeof r->history, "%s/.flint_shell_history", home);
      read_history(r->history);
    }
  }
#endif
}

static void reader_stop(line_reader *r) {
#ifdef FLINT_HAVE_LIBEDIT
  if (r->edit && r->history[0]) write_history(r->history);
#else
  (void)r;
#endif
}

/* ---- :load --------------------------------------------------------------------------------- */

static bool starts_word(const char *p, const char *word) {
  size_t n = strlen(word);
  return strncmp(p, word, n) == 0 && !(isalnum((unsigned char)p[n]) || p[n] == '_');
}

/* Runs a file's top-level items one by one: directives (a line each), declarations and
 * statements (to their ';' at depth 0), functions (to their closing brace). */
static bool load_file(shell_session *s, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "flint shell: cannot open %s: %s\n", path, strerror(errno));
    return false;
  }
  size_t cap = 4096, len = 0;
  char *text = malloc(cap);
  size_t n;
  while (text && (n = fread(text + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (len + 1 == cap) {
      char *more = realloc(text, cap *= 2);
      if (!more) free(text);
      text = more;
    }
  }
  fclose(f);
  if (!text) return false;
  text[len] = '\0';

  bool ok = true;
  const char *item = text;
  int depth = 0;
  const char *first_brace = NULL; /* of the item, at depth 0 */
  for (const char *c = text; *c && ok; c++) {
    if (c == item && isspace((unsigned char)*c)) { /* skip white space between items */
      item++;
      continue;
    }
    if (c[0] == '/' && c[1] == '*') {
      const char *end = strstr(c + 2, "*/");
      bool alone = c == item; /* a comment between items is no part of the next */
      c = end ? end + 1 : c + strlen(c) - 1;
      if (alone) item = c + 1;
      continue;
    }
    if (c[0] == '/' && c[1] == '/') {
      bool alone = c == item;
      while (c[1] && c[1] != '\n') c++;
      if (alone) item = c + 1;
      continue;
    }
    if (*c == '"' || *c == '\'') {
      char q = *c;
      for (c++; *c && *c != q; c++)
        if (*c == '\\' && c[1]) c++;
      if (!*c) break;
      continue;
    }
    const char *end = NULL;
    if (depth == 0 && c == item && *c == '#') { /* a directive: to its line's end */
      while (*c && !(*c == '\n' && c[-1] != '\\')) c++;
      end = c;
    } else if (*c == '(' || *c == '[' || *c == '{') {
      if (depth == 0 && *c == '{' && !first_brace) first_brace = c;
      depth++;
    } else if (*c == ')' || *c == ']' || *c == '}') {
      depth--;
      if (depth == 0 && *c == '}' && first_brace && !starts_word(item, "if") &&
          !starts_word(item, "typedef") && !starts_word(item, "struct") &&
          !starts_word(item, "union") && !starts_word(item, "enum")) {
        const char *b = first_brace;
        while (b > item && isspace((unsigned char)b[-1])) b--;
        if (b > item && b[-1] == ')') end = c + 1; /* a function's body ends the item */
      }
    } else if (depth == 0 && *c == ';') {
      end = c + 1;
    }
    if (end) {
      char *one = strndup(item, (size_t)(end - item));
      if (!one) break;
      unsigned line = 1;
      for (const char *l = text; l < item; l++)
        if (*l == '\n') line++;
      ok = shell_session_eval_at(s, one, path, line);
      free(one);
      item = end;
      c = end - 1;
      first_brace = NULL;
      if (!*end) break;
    }
  }
  free(text);
  return ok;
}

/* ---- commands -------------------------------------------------------------------------------- */

/* Runs a ':' command; false when it is :quit. */
static bool run_command(shell_session *s, char *line) {
  char *cmd = line + 1;
  char *arg = cmd;
  while (*arg && !isspace((unsigned char)*arg)) arg++;
  size_t cmd_len = (size_t)(arg - cmd);
  while (isspace((unsigned char)*arg)) arg++;
  size_t n = strlen(arg);
  while (n && isspace((unsigned char)arg[n - 1])) arg[--n] = '\0';
#define IS(word) (cmd_len == strlen(word) && strncmp(cmd, word, cmd_len) == 0)
  if (IS("quit") || IS("q") || IS("exit")) return false;
  if (IS("help") || IS("h") || IS("?")) {
    fputs(shell_help, stdout);
  } else if (IS("load")) {
    if (!*arg) fprintf(stderr, "flint shell: :load needs a file\n");
    else load_file(s, arg);
  } else if (IS("type")) {
    if (!*arg) fprintf(stderr, "flint shell: :type needs an expression\n");
    else shell_session_type(s, arg);
  } else if (IS("list")) {
    shell_session_list(s);
  } else {
    fprintf(stderr, "flint shell: unknown command ':%.*s' (:help lists them)\n", (int)cmd_len, cmd);
  }
#undef IS
  fflush(stdout);
  return true;
}

/* ---- the command ------------------------------------------------------------------------------ */

int cmd_shell(int argc, char **argv) {
  static const struct option longopts[] = {
      {"master", required_argument, NULL, 'm'}, CLI_COMMON_LONG_OPTIONS, {0}};
  const char *master = "local[*]";
  int c;
  optind = 1;
  while ((c = getopt_long(argc + 1, argv - 1, ":hV", longopts, NULL)) != -1) {
    switch (c) {
    case 'm': master = optarg; break;
    case CLI_OPT_HELP: fputs(cli_shell_usage, stdout); return 0;
    case CLI_OPT_VERSION: return cli_print_version();
    default: return cli_option_error("shell", c, argv - 1, longopts);
    }
  }
  if (optind < argc + 1) return cli_usage_error("shell", "unexpected argument '%s'", argv[optind - 1]);

  fl_context *ctx = NULL;
  fl_options options = FL_OPTIONS_INIT;
  options.app_name = "flint shell";
  /* A crash in a task's user code (local mode) ends only the input that ran the job; the
   * shell's own guard goes first, so that the tasks' guard hands it the rest. */
  options.contain_task_crashes = true;
  shell_guard_install();
  fl_status st = fl_context_open(master, &options, &ctx);
  if (st != FL_OK) return cli_failure("shell", "cannot open a context on %s: %s", master, fl_last_error());
  shell_session *s = shell_session_create(ctx);
  if (!s) {
    fl_context_close(ctx);
    return 1;
  }
  bool interactive = isatty(STDIN_FILENO);
  if (interactive)
    printf("flint %s shell on %s (%u cores): type C against `ctx`; :help for help, :quit to leave\n",
           FL_VERSION_STRING, master, fl_context_cores(ctx));
  fflush(stdout);

  line_reader reader;
  reader_start(&reader);
  char *input = NULL;
  size_t input_len = 0;
  for (;;) {
    char *line = read_line(&reader, input ? PROMPT_MORE : PROMPT);
    if (!line) break;
    if (!input) {
      const char *p = line;
      while (isspace((unsigned char)*p)) p++;
      if (*p == ':') {
        bool go_on = run_command(s, (char *)p);
        free(line);
        if (!go_on) break;
        continue;
      }
      if (!*p) {
        free(line);
        continue;
      }
    }
    size_t n = strlen(line);
    char *more = realloc(input, input_len + n + 2);
    if (!more) {
      free(line);
      break;
    }
    input = more;
    memcpy(input + input_len, line, n);
    input_len += n;
    input[input_len++] = '\n';
    input[input_len] = '\0';
    free(line);
    if (!shell_input_complete(input)) continue;
    shell_session_eval(s, input);
    free(input);
    input = NULL;
    input_len = 0;
  }
  free(input);
  reader_stop(&reader);
  if (interactive) putchar('\n');
  shell_session_destroy(s);
  fl_context_close(ctx);
  return 0;
}
