# `trainyard convert --quantize nf4|fp4 [--double_quant]` and --dequantize:
# bitsandbytes' 4-bit layout checked by a numpy reader (names, dtypes,
# shapes, quant_state JSON, quantization_config, values within the 4-bit
# error), damaged copies refused by name, the loader refusing U8 tensors.
add_test(NAME integration/convert_quantize
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/convert_quantize.sh)
set_tests_properties(integration/convert_quantize PROPERTIES LABELS integration TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
