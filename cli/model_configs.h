/* model_configs.h - the published config.json of the models that
 * `trainyard mkmodel --like NAME` copies, compiled in from
 * tests/data/configs/NAME.json (cli/embed_configs.cmake), so that the tests
 * and the installed binary read one copy. */
#ifndef TY_CLI_MODEL_CONFIGS_H
#define TY_CLI_MODEL_CONFIGS_H

#include <stddef.h>

typedef struct {
  const char *name; /* "llama-3.2-1b": the file name without .json */
  const char *json; /* the file's text */
} mkmodel_config_t;

extern const mkmodel_config_t mkmodel_configs[]; /* sorted by name */
extern const size_t mkmodel_configs_n;

#endif
