# The documentation (README.md, docs/): every shell block is run by a test
# or marked not runnable with the reason, and every link between pages
# (files and #anchors) leads somewhere (docs/check); the runnable blocks,
# the README's tour through trainyardd included, run as written, page by
# page in a scratch folder on tiny models (docs/blocks).
find_package(Python3 COMPONENTS Interpreter)
add_test(NAME docs/check
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/docs/docs_check.py)
set_tests_properties(docs/check PROPERTIES LABELS docs TIMEOUT 60)

if(NOT TRAINYARD_WORKER_ONLY)
  add_test(NAME docs/blocks
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs/run_blocks.sh)
  set_tests_properties(docs/blocks PROPERTIES LABELS docs TIMEOUT 600
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${TY_TEST_ENV}")
endif()
