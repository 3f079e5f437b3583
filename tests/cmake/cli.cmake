# The CLI's shell completion and help in a real bash: the script that
# `trainyard completion bash` prints, driven as readline drives it, and the
# docs pages that `help` and each `--help` name.
find_program(TY_BASH bash)
if(TY_BASH)
  add_test(NAME integration/completion_bash
           COMMAND ${TY_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/integration/completion_bash.sh)
  set_tests_properties(integration/completion_bash PROPERTIES LABELS integration TIMEOUT 60
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
