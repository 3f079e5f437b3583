# The two-node test cluster of deploy/slurm-cluster.sh: started, used from
# both nodes (srun and sbatch), and stopped with nothing left running. The
# suites that dispatch through Slurm use the same script. It takes the
# machine's Slurm ports, so no two of these run at once.
add_test(NAME integration/slurm_cluster
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/slurm_cluster.sh)
set_tests_properties(integration/slurm_cluster PROPERTIES LABELS integration TIMEOUT 180
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm
                     ENVIRONMENT "${TY_TEST_ENV}")

# dist.backend gloo through `trainyard train`: losses bit for bit those of
# shm. Skips (77) where the worker has no Gloo.
add_test(NAME integration/train_gloo
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/train_gloo.sh)
set_tests_properties(integration/train_gloo PROPERTIES LABELS integration TIMEOUT 600
                     SKIP_RETURN_CODE 77 ENVIRONMENT "${TY_TEST_ENV}")

# trainyardd --dispatcher slurm on that cluster with the real worker: a
# 2-node x 1-rank LoRA job (on both nodes, in the completion log, the local
# job's losses), cancel with no rank left, a killed rank restarted from its
# checkpoint. Starts and stops the cluster itself.
add_test(NAME integration/slurm_dispatch
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/integration/slurm_dispatch.py)
set_tests_properties(integration/slurm_dispatch PROPERTIES LABELS integration TIMEOUT 600
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm
                     ENVIRONMENT "${TY_TEST_ENV}")

# The "Running on a Slurm cluster" block of docs/slurm.md, run as written.
add_test(NAME integration/slurm_readme
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/slurm_readme.sh)
set_tests_properties(integration/slurm_readme PROPERTIES LABELS integration TIMEOUT 300
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm
                     ENVIRONMENT "${TY_TEST_ENV}")
