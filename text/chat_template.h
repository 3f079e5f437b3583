/* chat_template.h - chat templates: the Jinja subset that Hugging Face
 * tokenizer_config.json "chat_template" texts use, parsed once and rendered
 * per conversation.
 *
 * Supported: text, {{ }}, {% if/elif/else %}, {% for %} (loop.*, for-else,
 * unpacking, an `if` filter, break/continue), {% set %} (names, namespace
 * attributes, {% set x %}...{% endset %} blocks), {# #}, the whitespace
 * controls {%- -%} {{- -}} and Hugging Face's defaults (trim_blocks and
 * lstrip_blocks on, one trailing newline dropped, the {% generation %} tag
 * ignored); expressions with literals, lists, dicts, attributes, subscripts,
 * slices, arithmetic, ~, comparisons, and/or/not, in, tests, the ternary,
 * the filters, tests, methods and functions of the tables in
 * chat_template_filters.c and chat_template_lib.c.
 * Anything else is refused when parsed, naming the construct and the line:
 * "chat template line 3: filter 'wordcount' is not supported".
 *
 * Where Jinja and Hugging Face's JavaScript renderer (@huggingface/jinja)
 * differ, this follows the latter, which the tests compare against: none
 * renders as "", booleans as "true"/"false", a whole float as "2.0". */
#ifndef TY_TEXT_CHAT_TEMPLATE_H
#define TY_TEXT_CHAT_TEMPLATE_H

#include <stddef.h>

#include <jansson.h>

typedef struct tmpl_s tmpl_t;

/* Parses source (a NUL-terminated template, at most TMPL_MAX_SOURCE bytes)
 * into *out, which the caller frees with tmpl_free. 0, or TY_EINVAL with a
 * message naming the line and the problem in err (errlen bytes; err may be
 * NULL). */
int tmpl_parse(const char *source, tmpl_t **out, char *err, size_t errlen);

/* Frees t; accepts NULL. */
void tmpl_free(tmpl_t *t);

/* Renders t with the variables of context, a JSON object (borrowed, never
 * changed): messages, bos_token, eos_token, add_generation_prompt and any
 * others the template reads. *out becomes the malloc'd NUL-terminated text
 * (the caller frees it). 0; TY_EINVAL for a template error or a
 * raise_exception() (err holds its message after "chat template line N: ");
 * TY_EEXHAUSTED when a limit below is passed. *out is NULL on failure.
 * A render shares t's literals by reference count, so a tmpl_t serves one
 * thread at a time: parse one per thread. */
int tmpl_render(const tmpl_t *t, const json_t *context, char **out, char *err, size_t errlen);

/* The source text of a built-in template: "llama3", "llama2", "chatml" or
 * "mistral"; NULL for another name. Static. */
const char *tmpl_builtin(const char *name);

/* Limits against hostile templates. */
#define TMPL_MAX_SOURCE (1u << 20)  /* bytes of template text */
#define TMPL_MAX_DEPTH 500          /* nesting of expressions and blocks */
#define TMPL_MAX_ITERATIONS 1000000 /* loop iterations in one render */
#define TMPL_MAX_OUTPUT (64u << 20) /* bytes of rendered text */
#define TMPL_MAX_MADE (256u << 20)  /* bytes of strings and lists made in one render */

#endif
