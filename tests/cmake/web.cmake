# The status page and the API explorer: their embedded files (label unit,
# so the sanitizer build runs it too) and each page in headless Chromium
# against a real trainyardd (label web), with screenshots left in
# tests/web-artifacts/.
if(TRAINYARD_WORKER_ONLY OR NOT TARGET ty_web)
  return()
endif()
add_executable(test_web_assets ${CMAKE_CURRENT_SOURCE_DIR}/web/test_web_assets.c)
target_link_libraries(test_web_assets PRIVATE ty_web PkgConfig::JANSSON PkgConfig::CMOCKA)
add_test(NAME unit/test_web_assets COMMAND test_web_assets)
set_tests_properties(unit/test_web_assets PROPERTIES LABELS unit TIMEOUT 60
                     ENVIRONMENT "${TY_TEST_ENV}")

# The browser test needs the server and the test worker (tests/cmake/server.cmake).
find_program(TY_NODE node)
if(TARGET trainyardd AND TARGET ty_test_worker AND TY_NODE)
  add_test(NAME web/page COMMAND ${TY_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/web/page_test.js)
  set_tests_properties(web/page PROPERTIES LABELS web TIMEOUT 180 RUN_SERIAL TRUE
                       ENVIRONMENT "${TY_TEST_ENV};NODE_PATH=${TY_WEB_NODE_MODULES}")
  add_test(NAME web/docs COMMAND ${TY_NODE} ${CMAKE_CURRENT_SOURCE_DIR}/web/docs_test.js)
  set_tests_properties(web/docs PROPERTIES LABELS web TIMEOUT 120 RUN_SERIAL TRUE
                       ENVIRONMENT "${TY_TEST_ENV};NODE_PATH=${TY_WEB_NODE_MODULES}")
endif()
