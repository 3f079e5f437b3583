# Suites of the model: forward and backward (full and LoRA) against a
# PyTorch reference.
add_executable(model_driver ${CMAKE_CURRENT_SOURCE_DIR}/numerics/model_driver.c)
target_link_libraries(model_driver PRIVATE ty_worker PkgConfig::JANSSON)
add_test(NAME numerics/model
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/numerics/model_ref.py
                 $<TARGET_FILE:model_driver> ${CMAKE_CURRENT_BINARY_DIR}/numerics-model)
set_tests_properties(numerics/model PROPERTIES LABELS numerics TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
# `trainyard generate`: greedy tokens (with and without the key/value cache)
# against a greedy decode in PyTorch.
add_test(NAME numerics/generate
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/numerics/generate_ref.py
                 $<TARGET_FILE:trainyard> ${CMAKE_CURRENT_BINARY_DIR}/numerics-generate)
set_tests_properties(numerics/generate PROPERTIES LABELS numerics TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
# `trainyard generate --device cpu|cuda|auto` in a build without CUDA:
# cuda refused saying so, auto on the CPU (a CUDA build runs the same
# script as gpu/generate_device, tests/cmake/gpu.cmake).
if(NOT TRAINYARD_HAVE_CUDA)
  add_test(NAME integration/generate_device
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/generate_device.sh none)
  set_tests_properties(integration/generate_device PROPERTIES LABELS integration TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
