# The control server's suites: integration tests of trainyardd over loopback
# with real clients (python3-requests), ranks played by ty_test_worker.
if(TRAINYARD_WORKER_ONLY OR NOT TARGET trainyardd)
  return()
endif()
add_executable(ty_test_worker ${CMAKE_CURRENT_SOURCE_DIR}/worker/ty_test_worker.c)
target_link_libraries(ty_test_worker PRIVATE ty_worker)
# A libnvidia-ml.so.1 whose GPUs the environment sizes, for the GPU memory
# rule's tests on hosts without a driver (integration/server_api).
add_library(ty_fake_nvml SHARED ${CMAKE_CURRENT_SOURCE_DIR}/nvml/fake_nvml.c)
set_target_properties(ty_fake_nvml PROPERTIES OUTPUT_NAME nvidia-ml PREFIX lib SUFFIX .so.1
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/nvml)

find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  file(GLOB TY_SERVER_SUITES CONFIGURE_DEPENDS
       ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_server_*.py)
  foreach(script ${TY_SERVER_SUITES})
    get_filename_component(suite ${script} NAME_WE)
    string(REGEX REPLACE "^test_" "" suite ${suite})
    add_test(NAME integration/${suite} COMMAND ${Python3_EXECUTABLE} ${script})
    set_tests_properties(integration/${suite} PROPERTIES LABELS integration TIMEOUT 300
                         ENVIRONMENT "${TY_TEST_ENV}")
  endforeach()
  # cuda jobs through trainyardd with the real worker, against CPU jobs
  # (one GPU per rank; skips without a GPU; runs on the simulated device).
  if(TRAINYARD_HAVE_CUDA)
    add_test(NAME gpu/server COMMAND ${Python3_EXECUTABLE}
                                     ${CMAKE_SOURCE_DIR}/tests/gpu/server_check.py)
    set_tests_properties(gpu/server PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600
                         ENVIRONMENT "${TY_TEST_ENV}")
  endif()
  # wrk against trainyardd beside nginx; not in CI (label bench).
  add_test(NAME bench/api COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/bench/api.py)
  set_tests_properties(bench/api PROPERTIES LABELS bench TIMEOUT 600 ENVIRONMENT "${TY_TEST_ENV}")
  # What shortest reals cost a JSON answer against jansson alone (label bench).
  add_executable(json_dumps_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/json_dumps.c)
  target_link_libraries(json_dumps_bench PRIVATE ty_common)
  add_test(NAME bench/json_dumps COMMAND json_dumps_bench)
  set_tests_properties(bench/json_dumps PROPERTIES LABELS bench TIMEOUT 600)
  # The server's instructions per submission under callgrind (label bench).
  add_test(NAME bench/submit_cost COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench/submit_cost.sh
                                          ${CMAKE_BINARY_DIR})
  set_tests_properties(bench/submit_cost PROPERTIES LABELS bench TIMEOUT 600)
endif()
