# The status page: its embedded files (label unit, so the sanitizer build
# runs it too).
if(TRAINYARD_WORKER_ONLY OR NOT TARGET ty_web)
  return()
endif()
add_executable(test_web_assets ${CMAKE_CURRENT_SOURCE_DIR}/web/test_web_assets.c)
target_link_libraries(test_web_assets PRIVATE ty_web PkgConfig::CMOCKA)
add_test(NAME unit/test_web_assets COMMAND test_web_assets)
set_tests_properties(unit/test_web_assets PROPERTIES LABELS unit TIMEOUT 60
                     ENVIRONMENT "${TY_TEST_ENV}")

