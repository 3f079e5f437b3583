# The job spec's integration checks: the real `trainyard validate` binary
# and the API description files.
add_test(NAME integration/spec_cli
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/spec_cli.sh)
set_tests_properties(integration/spec_cli PROPERTIES LABELS integration TIMEOUT 120
                     ENVIRONMENT "${TY_TEST_ENV}")
add_test(NAME integration/api_files
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/integration/check_api_files.py
                 ${CMAKE_SOURCE_DIR}/api/openapi.yaml ${CMAKE_SOURCE_DIR}/api/trainyard.proto
                 ${CMAKE_SOURCE_DIR}/server/rest.c)
set_tests_properties(integration/api_files PROPERTIES LABELS integration TIMEOUT 60)
