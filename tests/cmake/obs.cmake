# Observability suites: TensorBoard event files read back by an independent
# reader (tests/obs/tfevents.py), Prometheus series parsed by
# prometheus_client, progress, ETA and thinned curves, all against a real
# trainyardd. Debian's python3 (python3-protobuf, python3-prometheus-client).
if(TRAINYARD_WORKER_ONLY OR NOT TARGET trainyardd)
  return()
endif()
set(TY_OBS_PY /usr/bin/python3)
file(GLOB TY_OBS_SUITES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/obs/test_obs_*.py)
foreach(script ${TY_OBS_SUITES})
  get_filename_component(suite ${script} NAME_WE)
  string(REGEX REPLACE "^test_obs_" "" suite ${suite})
  add_test(NAME integration/obs_${suite} COMMAND ${TY_OBS_PY} ${script})
  set_tests_properties(integration/obs_${suite} PROPERTIES LABELS integration TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endforeach()
