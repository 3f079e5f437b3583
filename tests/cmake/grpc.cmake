# The gRPC API's suites: integration tests of trainyardd's trainyard.v1
# service with Debian's python3-grpcio and protoc-generated classes (the
# server's test worker plays the ranks), and the gRPC benchmark.
if(TRAINYARD_WORKER_ONLY OR NOT TARGET trainyardd
   OR NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/integration/tyserver.py)
  return()
endif()
set(TY_GRPC_PY /usr/bin/python3)
foreach(suite api cli samples dpo)
  add_test(NAME integration/grpc_${suite}
           COMMAND ${TY_GRPC_PY} ${CMAKE_CURRENT_SOURCE_DIR}/grpc/test_grpc_${suite}.py)
  set_tests_properties(integration/grpc_${suite} PROPERTIES LABELS integration TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endforeach()

# Benchmark (label bench, not run by CI): GetJob calls/s and WatchJob fan-out.
add_test(NAME bench/grpc
         COMMAND ${TY_GRPC_PY} ${CMAKE_CURRENT_SOURCE_DIR}/bench/grpc/bench_grpc.py)
set_tests_properties(bench/grpc PROPERTIES LABELS bench TIMEOUT 600 ENVIRONMENT "${TY_TEST_ENV}")
