# 4-bit quantization (worker/ckpt/quant4.c): NF4 / FP4 codes, scales and the
# nested 8-bit scales bit for bit against a numpy reference written from
# bitsandbytes' kernels (tests/numerics/quant4_ref.py).
add_executable(quant4_driver ${CMAKE_CURRENT_SOURCE_DIR}/numerics/quant4_driver.c)
target_link_libraries(quant4_driver PRIVATE ty_worker)
add_test(NAME numerics/quant4
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/numerics/quant4_ref.py
                 $<TARGET_FILE:quant4_driver> ${CMAKE_CURRENT_BINARY_DIR}/numerics-quant4)
set_tests_properties(numerics/quant4 PROPERTIES LABELS numerics TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
