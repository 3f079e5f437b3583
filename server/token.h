/* token.h - bearer tokens compared in constant time: the API tokens of
 * trainyardd's option `tokens` (REST and gRPC) and a job's report token
 * (service). The time a comparison takes says nothing about how much of a
 * guess was right. */
#ifndef TY_SERVER_TOKEN_H
#define TY_SERVER_TOKEN_H

#include <stdbool.h>

/* Whether a and b are the same string; every byte of the shorter is
 * compared whatever the others hold. */
bool token_equal(const char *a, const char *b);

/* Whether tokens (comma- or space-separated API tokens) lists any: then
 * every API call needs one. */
bool token_required(const char *tokens);

/* Whether token is one of tokens; every entry is compared in full. */
bool token_listed(const char *tokens, const char *token);

#endif
