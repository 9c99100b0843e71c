"""The runnable stories: the demo, the benchmarks, Lambda vs Kappa, dual writes, the erasure
audit, fault runs. The top floor: each imports the floors below (app_sim, pipelines, contract,
infra) and nothing imports it."""
