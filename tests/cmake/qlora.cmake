# QLoRA: a 4-bit base quantized as each rank's piece loads, trained under
# LoRA on 1, 2 and 4 CPU ranks, against a float32 checkpoint of the weights
# a Python reference of bitsandbytes' algorithm dequantized.
add_test(NAME integration/train_qlora
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train_qlora.sh)
set_tests_properties(integration/train_qlora PROPERTIES LABELS integration TIMEOUT 600
                     ENVIRONMENT "${TY_TEST_ENV}")
# The host-memory rule's figures for QLoRA against LoRA over a published
# config (tests/bench/qlora.sh prints them beside its measured rows).
add_executable(qlora_paper ${CMAKE_CURRENT_SOURCE_DIR}/bench/qlora_paper.c)
target_link_libraries(qlora_paper PRIVATE ty_api)
