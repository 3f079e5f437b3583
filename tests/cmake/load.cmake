# Suites of checkpoint loading: mkmodel + `trainyard load` end to end with
# real worker processes (integration), and the >= 2 GiB two-rank benchmark
# of both load paths (bench; run by hand, not in CI).
add_test(NAME integration/load
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/load.sh)
set_tests_properties(integration/load PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
add_test(NAME bench/load COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench/load.sh)
set_tests_properties(bench/load PROPERTIES LABELS bench TIMEOUT 3600
                     ENVIRONMENT "${TY_TEST_ENV}")
# PyTorch checkpoints (torch.save at run time, python3-torch): convert,
# both load paths and eval against the safetensors twin; hostile files.
add_test(NAME integration/pytorch
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/pytorch.sh)
set_tests_properties(integration/pytorch PROPERTIES LABELS integration TIMEOUT 600
                     ENVIRONMENT "${TY_TEST_ENV}")
