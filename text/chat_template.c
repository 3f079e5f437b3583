/* chat_template.c - the built-in chat templates: the published
 * tokenizer_config.json "chat_template" texts of four model families, for
 * data whose model ships none. */
#include <string.h>

#include "text/chat_template.h"

typedef struct {
  const char *name;
  const char *source;
} builtin_t;

static const builtin_t kBuiltins[] = {
    /* Meta Llama 3 Instruct */
    {"llama3",
     "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
     "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
     "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
     "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
     "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
    /* Llama 2 chat: the system prompt folded into the first user turn */
    {"llama2",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
     "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
     "system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
     "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
     "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == "
     "0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
     "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
     "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
     "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
     "eos_token }}{% endif %}{% endfor %}"},
    /* ChatML as Qwen2 Instruct writes it: a default system turn */
    {"chatml",
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
     "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
     "%}{{'<|im_start|>' "
     "+ message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
     "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    /* Mistral 7B Instruct v0.1: user and assistant turns only */
    {"mistral",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
     "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
     "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
     "'[INST] "
     "' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
     "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
     "are supported!') }}{% endif %}{% endfor %}"},
};

const char *tmpl_builtin(const char *name) {
  for (size_t i = 0; name && i < sizeof kBuiltins / sizeof *kBuiltins; i++)
    if (!strcmp(kBuiltins[i].name, name)) return kBuiltins[i].source;
  return NULL;
}
