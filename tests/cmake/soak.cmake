# The chaos soak (tests/soak/chaos.sh): 3 minutes, a fixed seed, fails on
# any violation of its invariants (3 minutes of faults, then the drain, the
# undisturbed reference runs and the checks at the end: TIMEOUT 900).
# Labelled integration and soak, so the ctest run of tests/run-all.sh
# (which leaves out only fuzz and bench) runs it.
if(TRAINYARD_WORKER_ONLY OR NOT TARGET trainyardd)
  return()
endif()
find_package(Python3 COMPONENTS Interpreter)
if(Python3_FOUND)
  add_test(NAME soak/chaos COMMAND bash ${CMAKE_SOURCE_DIR}/tests/soak/chaos.sh
                                   --minutes 3 --seed 41)
  set_tests_properties(soak/chaos PROPERTIES LABELS "integration;soak" TIMEOUT 900
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
