# comm and the local launcher: the stand-in worker the launcher's unit test
# (tests/unit/test_launch.c) starts, and the comm bandwidth benchmark
# (label bench; tests/bench/comm runs it).
add_executable(launch_testworker ${CMAKE_SOURCE_DIR}/tests/comm/launch_testworker.c)
target_link_libraries(launch_testworker PRIVATE ty_worker)
if(TEST unit/test_launch)
  set_property(TEST unit/test_launch APPEND PROPERTY ENVIRONMENT
               "TY_TESTWORKER_BIN=$<TARGET_FILE:launch_testworker>")
endif()
add_executable(bench_comm ${CMAKE_SOURCE_DIR}/tests/comm/bench_comm.c)
target_link_libraries(bench_comm PRIVATE ty_worker)
add_test(NAME bench/comm COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/bench/comm.sh)
set_tests_properties(bench/comm PROPERTIES LABELS bench TIMEOUT 600
                     ENVIRONMENT "${TY_TEST_ENV}")
