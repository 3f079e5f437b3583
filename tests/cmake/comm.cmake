# comm and the local launcher: the stand-in worker the launcher's unit test
# (tests/unit/test_launch.c) starts, and the comm bandwidth benchmark
# (label bench; tests/bench/comm runs it).
add_executable(launch_testworker ${CMAKE_SOURCE_DIR}/tests/comm/launch_testworker.c)
target_link_libraries(launch_testworker PRIVATE ty_worker)
if(TEST unit/test_launch)
  set_property(TEST unit/test_launch APPEND PROPERTY ENVIRONMENT
               "TY_TESTWORKER_BIN=$<TARGET_FILE:launch_testworker>")
endif()
