# Chat templates (text/chat_template): rendered text compared with
# @huggingface/jinja's, the reference installed by `npm ci` from
# tests/chat/package-lock.json into the build directory (labels unit and
# chat, so the sanitizer build runs it too). Needs node and npm, as the web
# page's build does; worker-only builds leave it out.
if(TRAINYARD_WORKER_ONLY)
  return()
endif()
find_program(TY_NODE node)
find_program(TY_NPM npm)
set(TY_CHAT_NPM_DIR ${CMAKE_CURRENT_BINARY_DIR}/chat-npm)
set(TY_CHAT_NPM_STAMP ${TY_CHAT_NPM_DIR}/npm-ci.stamp)
if(NOT TY_NODE OR (NOT TY_NPM AND NOT EXISTS ${TY_CHAT_NPM_STAMP}))
  message(STATUS "trainyard: node or npm not found; the chat template comparison is left out")
  return()
endif()
file(MAKE_DIRECTORY ${TY_CHAT_NPM_DIR})
add_custom_command(
  OUTPUT ${TY_CHAT_NPM_STAMP}
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_CURRENT_SOURCE_DIR}/chat/package.json
          ${CMAKE_CURRENT_SOURCE_DIR}/chat/package-lock.json ${TY_CHAT_NPM_DIR}
  COMMAND ${TY_NPM} ci --no-audit --no-fund --prefer-offline --loglevel=error
  COMMAND ${CMAKE_COMMAND} -E touch ${TY_CHAT_NPM_STAMP}
  WORKING_DIRECTORY ${TY_CHAT_NPM_DIR}
  DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/chat/package.json
          ${CMAKE_CURRENT_SOURCE_DIR}/chat/package-lock.json
  COMMENT "npm ci: the chat template tests' reference renderer (tests/chat/package-lock.json)"
  VERBATIM)
add_custom_target(ty_chat_npm ALL DEPENDS ${TY_CHAT_NPM_STAMP})

add_executable(test_chat_compare ${CMAKE_CURRENT_SOURCE_DIR}/chat/test_chat_compare.c)
target_link_libraries(test_chat_compare PRIVATE ty_text)
add_dependencies(test_chat_compare ty_chat_npm)
add_test(NAME chat/compare COMMAND test_chat_compare)
set_tests_properties(chat/compare PROPERTIES LABELS "unit;chat" TIMEOUT 120
                     ENVIRONMENT "${TY_TEST_ENV};TY_NODE=${TY_NODE};NODE_PATH=${TY_CHAT_NPM_DIR}/node_modules")
