# Preference tuning (train.objective dpo): one micro-batch of pairs through
# trainyard's data and passes against TRL's loss written in PyTorch
# (tests/numerics/dpo_ref.py), for each loss type, LoRA and full training.
add_executable(dpo_driver ${CMAKE_CURRENT_SOURCE_DIR}/numerics/dpo_driver.c)
target_link_libraries(dpo_driver PRIVATE ty_worker PkgConfig::JANSSON)
add_test(NAME numerics/dpo
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/numerics/dpo_ref.py
                 $<TARGET_FILE:dpo_driver> ${CMAKE_CURRENT_BINARY_DIR}/numerics-dpo)
set_tests_properties(numerics/dpo PROPERTIES LABELS numerics TIMEOUT 300
                     ENVIRONMENT "${TY_TEST_ENV}")
