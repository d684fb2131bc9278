/*
 * cli/shell.h: the parts of `flint shell` (private to cli/shell*.c).
 *
 * cli/shell.c reads inputs (libedit on a terminal, fgets otherwise) and runs the ':'
 * commands; cli/shell_session.c turns each input into C, compiles it with the system
 * compiler into a shared library of its own and runs it against the session's context.
 * Single-threaded: everything here runs on the shell's one thread.
 */
#ifndef FLINT_CLI_SHELL_H
#define FLINT_CLI_SHELL_H

#include <stdbool.h>
#include <stddef.h>

#include "flint/flint.h"

typedef struct shell_session shell_session;

/* Makes a session: a temporary folder for its sources and libraries, and the folder whose
 * flint/flint.h user code includes (shell_session_include_dir says which was found).
 * Returns NULL after printing why on stderr. `ctx` stays the caller's. */
shell_session *shell_session_create(fl_context *ctx);
/* Frees the datasets held by the session's `fl_dataset *` variables, then removes the
 * temporary folder. The loaded libraries stay loaded (the context may still use their
 * functions until it closes). NULL does nothing. */
void shell_session_destroy(shell_session *s);
const char *shell_session_include_dir(const shell_session *s);
/* Installs the shell's own crash guard (a crash on the shell's thread ends that input), once.
 * Call before the context opens: the context's guard of task threads (contain_task_crashes)
 * must come after it, to hand it the crashes that are not a task's. */
void shell_guard_install(void);

/* Compiles and runs one input (a statement, a declaration, a function, a directive).
 * Compile errors and crashes are printed on stderr; returns false after either. */
bool shell_session_eval(shell_session *s, const char *input);
/* The same for text from a file (:load): messages name `file` and count its lines from
 * `first_line`. */
bool shell_session_eval_at(shell_session *s, const char *input, const char *file, unsigned first_line);
/* Prints the type of expression `expr` (as the compiler names it) on stdout. */
bool shell_session_type(shell_session *s, const char *expr);
/* Prints what the session has defined so far (its directives, variables and functions). */
void shell_session_list(const shell_session *s);

/* True when `text` is a whole input: brackets, parentheses and braces balanced outside
 * strings, characters and comments, no comment left open and no trailing backslash. */
bool shell_input_complete(const char *text);

#endif
