# The two-node test cluster of deploy/slurm-cluster.sh: started, used from
# both nodes (srun and sbatch), and stopped with nothing left running. The
# suites that dispatch through Slurm use the same script. It takes the
# machine's Slurm ports, so no two of these run at once.
add_test(NAME integration/slurm_cluster
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/slurm_cluster.sh)
set_tests_properties(integration/slurm_cluster PROPERTIES LABELS integration TIMEOUT 180
                     SKIP_RETURN_CODE 77 RESOURCE_LOCK slurm
                     ENVIRONMENT "${TY_TEST_ENV}")
