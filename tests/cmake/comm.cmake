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
# The NCCL backend on real GPUs (label gpu; exits 77, a skip, without one).
if(TRAINYARD_HAVE_CUDA AND NCCL_LIB AND NCCL_INCLUDE)
  add_executable(nccl_check ${CMAKE_SOURCE_DIR}/tests/comm/nccl_check.c)
  target_link_libraries(nccl_check PRIVATE ty_worker)
  add_test(NAME gpu/comm_nccl COMMAND nccl_check)
  set_tests_properties(gpu/comm_nccl PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
