# GPU suites (label gpu): the CUDA kernels against the CPU backend and both
# load paths onto the device. Built wherever the CUDA toolkit is found; each
# exits 77 (a ctest skip) with the reason printed when no GPU is visible.
# tests/gpu/run.sh runs them, and the GPU bench, on a GPU host.
if(TRAINYARD_HAVE_CUDA)
  foreach(check kernels load model mem generate)
    add_executable(gpu_${check}_check ${CMAKE_SOURCE_DIR}/tests/gpu/${check}_check.c)
    target_link_libraries(gpu_${check}_check PRIVATE ty_worker)
    add_test(NAME gpu/${check} COMMAND gpu_${check}_check)
    set_tests_properties(gpu/${check} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                         ENVIRONMENT "${TY_TEST_ENV}")
  endforeach()
endif()
# `trainyard generate --device cuda`: greedy tokens equal to the PyTorch
# reference's and the CPU decoder's (tests/numerics/generate_ref.py's cases:
# Llama, tied + Llama 3 rope with a prompt over one chunk, LoRA, Mistral's
# window, an eos list, Qwen2 with and without an adapter). Labelled
# numerics, as it needs PyTorch, which a GPU host running tests/gpu/run.sh
# (label gpu) may lack; there gpu/generate checks the same decoder against
# the CPU one. gpu/generate_device: --device cpu|cuda|auto through the CLI
# (refusals, auto's choice, bf16 and float32 weights on the GPU).
if(TRAINYARD_HAVE_CUDA)
  add_test(NAME gpu/generate_cli
           COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/numerics/generate_ref.py
                   $<TARGET_FILE:trainyard> ${CMAKE_CURRENT_BINARY_DIR}/gpu-generate --device cuda)
  set_tests_properties(gpu/generate_cli PROPERTIES LABELS numerics SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
  add_test(NAME gpu/generate_device
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/generate_device.sh cuda)
  set_tests_properties(gpu/generate_device PROPERTIES LABELS gpu TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
# Sharded LoRA passes over NCCL against the whole model (one rank per GPU).
if(TRAINYARD_HAVE_CUDA AND NCCL_LIB AND NCCL_INCLUDE)
  add_executable(gpu_fsdp_check ${CMAKE_SOURCE_DIR}/tests/gpu/fsdp_check.c)
  target_link_libraries(gpu_fsdp_check PRIVATE ty_worker)
  add_test(NAME gpu/fsdp COMMAND gpu_fsdp_check)
  set_tests_properties(gpu/fsdp PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
# LoRA training on one GPU against the CPU worker (skips without a GPU).
if(TRAINYARD_HAVE_CUDA)
  add_test(NAME gpu/train COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/train_cli.sh)
  set_tests_properties(gpu/train PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "${TY_TEST_ENV}")
  # Preference tuning on one GPU against the CPU worker, LoRA and every weight.
  add_test(NAME gpu/dpo COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/dpo_cli.sh)
  set_tests_properties(gpu/dpo PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "${TY_TEST_ENV}")
  # train.sample_prompts on a GPU job, against trainyard generate.
  add_test(NAME gpu/samples COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/samples_cli.sh)
  set_tests_properties(gpu/samples PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
if(TRAINYARD_HAVE_CUDA)
  add_test(NAME integration/load_cuda COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/load_cli.sh)
  set_tests_properties(integration/load_cuda PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
# A device too small for the job (any GPU, capped by
# TRAINYARD_CUDA_MEM_LIMIT_MIB): the errors name what to change.
if(TRAINYARD_HAVE_CUDA)
  add_test(NAME gpu/oom COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/oom_cli.sh)
  set_tests_properties(gpu/oom PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
# The GPU bench's programs (run by tests/gpu/bench.sh, not by ctest; on the
# simulated device gpu/bench_smoke runs them on a small model).
if(TRAINYARD_HAVE_CUDA)
  foreach(bench load lora full attn profile)
    add_executable(gpu_bench_${bench} ${CMAKE_SOURCE_DIR}/tests/gpu/bench_${bench}.c)
    target_link_libraries(gpu_bench_${bench} PRIVATE ty_worker)
  endforeach()
endif()
# The CUDA backend's profiler through bench_profile on a small model: every
# op of a LoRA step counted as the layer count says, shares that add up,
# the ops' time within the device span and the wall time, and the same
# losses and adapters bit for bit with profiling off (skips without a GPU).
if(TRAINYARD_HAVE_CUDA)
  add_test(NAME gpu/profile COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/profile_check.sh)
  set_tests_properties(gpu/profile PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
# The worker-only variant a GPU host builds, here without CUDA (quick).
add_test(NAME integration/worker_only COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/worker_only.sh)
set_tests_properties(integration/worker_only PROPERTIES LABELS integration TIMEOUT 600
                     ENVIRONMENT "${TY_TEST_ENV}")
# Where the CUDA build finds NCCL: $NCCL_HOME, the toolkit, a python wheel.
add_test(NAME integration/nccl_find COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/nccl_find.sh)
set_tests_properties(integration/nccl_find PROPERTIES LABELS integration TIMEOUT 600
                     SKIP_RETURN_CODE 77 ENVIRONMENT "${TY_TEST_ENV}")
# tests/gpu/run.sh itself, rehearsed on the simulated device.
add_test(NAME integration/gpu_run COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/run_rehearsal.sh)
set_tests_properties(integration/gpu_run PROPERTIES LABELS integration TIMEOUT 900
                     ENVIRONMENT "${TY_TEST_ENV}")
# The simulated device's own checks (a TRAINYARD_CUDA=SIM build; its kernels
# are C++, as worker/cuda/*.cu are built there).
if(TRAINYARD_CUDA_SIM)
  add_executable(cudasim_check ${CMAKE_SOURCE_DIR}/tests/cudasim/sim_check.cpp)
  target_link_libraries(cudasim_check PRIVATE ty_cudasim ty_cudasim_cublas)
  add_test(NAME sim/device COMMAND cudasim_check)
  set_tests_properties(sim/device PROPERTIES LABELS gpu TIMEOUT 120 ENVIRONMENT "${TY_TEST_ENV}")
  # The GPU bench's programs and script end to end on a small model.
  add_test(NAME gpu/bench_smoke COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/bench_smoke.sh)
  set_tests_properties(gpu/bench_smoke PROPERTIES LABELS gpu TIMEOUT 300
                       ENVIRONMENT "${TY_TEST_ENV}")
endif()
