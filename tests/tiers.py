"""Every test's tier, declared: the tier of each test module, and the tests that differ from
their module's. tests/conftest.py marks each collected test from here (or from a tier mark the
test carries itself, such as a module's ``pytestmark = pytest.mark.subprocess``); a test with
neither is an error, so a new test module is declared here with its tier.

    unit        in-process, no child process (the fast tier: `python -m pytest -m unit`, README
                "Tests"; under a minute on the 2-core machine)
    heavy       in-process, no child process, but over a second a test on the 2-core machine
                (`--durations=50` of `-m unit`): models against Hugging Face, the trainer's CLI
                and the InfiniTrain stand-in run in process, damaged-file and fuzz sweeps, the
                report's plots, the solver against brute force; re-measure when adding a slow one
    subprocess  starts another process (python, pytest, a Slurm cluster's jobs) but not the
                trainer's ranks
    torchrun    launches the trainer's ranks (torchrun, the zygote, the harness's own config
                cases: configs/test_config.json)
    gpu         needs CUDA (none does today: the tests about CUDA check its refusal without one)

`-m "unit or heavy"` is every in-process test. Wall-clock bounds are not tests: they live in
benchmarks/.
"""

from __future__ import annotations

TIERS = ("unit", "heavy", "subprocess", "torchrun", "gpu")
UNIT, HEAVY, SUBPROCESS, TORCHRUN, GPU = TIERS

# A collected file (relative to the rootdir) -> the tier of its tests.
MODULES: dict[str, str] = {
    "configs/test_config.json": TORCHRUN,
    "tests/benchmarks/test_gpu_check.py": TORCHRUN,
    "tests/benchmarks/test_history_detection.py": UNIT,
    "tests/benchmarks/test_mutation_script.py": UNIT,
    "tests/benchmarks/test_numerics_scripts.py": UNIT,
    "tests/benchmarks/test_solver_baselines.py": UNIT,
    "tests/baseline/test_baseline_gradients.py": UNIT,
    "tests/baseline/test_baseline_lr.py": UNIT,
    "tests/baseline/test_baseline_sessions.py": TORCHRUN,
    "tests/baseline/test_live_cache_key.py": UNIT,
    "tests/baseline/test_recorded_and_summary.py": UNIT,
    "tests/baseline/test_semantics.py": UNIT,
    "tests/bisect/test_bundled_trainer.py": TORCHRUN,
    "tests/bisect/test_cache.py": UNIT,
    "tests/bisect/test_cache_key.py": UNIT,
    "tests/bisect/test_cli.py": SUBPROCESS,
    "tests/cases/test_args.py": UNIT,
    "tests/cases/test_branch_configs.py": UNIT,
    "tests/cases/test_build.py": UNIT,
    "tests/cases/test_expand.py": UNIT,
    "tests/cases/test_load.py": UNIT,
    "tests/cases/test_runner_options.py": UNIT,
    "tests/cases/test_node_ids.py": UNIT,
    "tests/cases/test_schema.py": UNIT,
    "tests/cases/test_validate.py": UNIT,
    "tests/compare/test_baseline_judge.py": UNIT,
    "tests/compare/test_calibration.py": UNIT,
    "tests/compare/test_case_verdict.py": UNIT,
    "tests/compare/test_diff.py": UNIT,
    "tests/compare/test_disk.py": UNIT,
    "tests/compare/test_fastdiff.py": UNIT,
    "tests/compare/test_locate_foreign.py": UNIT,
    "tests/compare/test_no_torch.py": SUBPROCESS,
    "tests/compare/test_render.py": UNIT,
    "tests/compare/test_tp_shards.py": UNIT,
    "tests/compare/test_trace.py": UNIT,
    "tests/compare/test_update_resolution.py": UNIT,
    "tests/compare/test_verdict.py": UNIT,
    "tests/compare/test_verdict_vectors.py": UNIT,
    "tests/history/test_concurrent.py": SUBPROCESS,
    "tests/history/test_findings.py": UNIT,
    "tests/history/test_history_cli.py": HEAVY,
    "tests/history/test_plots.py": HEAVY,
    "tests/history/test_rows_cache_key.py": UNIT,
    "tests/history/test_run_folders.py": UNIT,
    "tests/history/test_store.py": UNIT,
    "tests/infinitrain/test_baseline_plants.py": TORCHRUN,
    "tests/infinitrain/test_branches.py": TORCHRUN,
    "tests/infinitrain/test_infinitrain_config.py": TORCHRUN,
    "tests/infinitrain_standin/test_branches_standin.py": SUBPROCESS,
    "tests/infinitrain_standin/test_model.py": UNIT,
    "tests/infinitrain_standin/test_precision_check_standin.py": SUBPROCESS,
    "tests/infinitrain_standin/test_standin.py": SUBPROCESS,
    "tests/infinitrain_standin/test_trace_baseline_standin.py": TORCHRUN,
    "tests/launch/test_backends.py": UNIT,
    "tests/launch/test_binary_facts.py": UNIT,
    "tests/launch/test_infinitrain_backend.py": UNIT,
    "tests/launch/test_leases.py": SUBPROCESS,
    "tests/launch/test_multinode.py": UNIT,
    "tests/launch/test_process.py": SUBPROCESS,
    "tests/launch/test_reaper.py": SUBPROCESS,
    "tests/launch/test_registered_parts.py": SUBPROCESS,
    "tests/launch/test_slurm.py": SUBPROCESS,
    "tests/launch/test_slurm_docs.py": SUBPROCESS,
    "tests/launch/test_trainer_sources.py": UNIT,
    "tests/launch/test_zygote.py": TORCHRUN,
    "tests/layout/test_bounds.py": UNIT,
    "tests/layout/test_chunk_search.py": UNIT,
    "tests/layout/test_errors.py": UNIT,
    "tests/layout/test_import.py": SUBPROCESS,
    "tests/layout/test_layout.py": UNIT,
    "tests/layout/test_parsers.py": UNIT,
    "tests/layout/test_profile.py": UNIT,
    "tests/layout/test_schedules.py": UNIT,
    "tests/layout/test_solver.py": UNIT,
    "tests/layout/test_suggest.py": UNIT,
    "tests/layout/test_suggest_chunks.py": UNIT,
    "tests/logs/test_baseline_verdict.py": UNIT,
    "tests/logs/test_cli.py": UNIT,
    "tests/logs/test_pairing.py": UNIT,
    "tests/logs/test_readers.py": UNIT,
    "tests/logs/test_command_line.py": UNIT,
    "tests/logs/test_selfcheck.py": UNIT,
    "tests/logs/test_selfcheck_real.py": UNIT,
    "tests/plugin/test_case_selection.py": SUBPROCESS,
    "tests/plugin/test_config_paths.py": SUBPROCESS,
    "tests/plugin/test_e2e.py": TORCHRUN,
    "tests/plugin/test_e2e_updates.py": TORCHRUN,
    "tests/plugin/test_planted.py": SUBPROCESS,
    "tests/plugin/test_plugin.py": SUBPROCESS,
    "tests/plugin/test_session_dir.py": UNIT,
    "tests/plugin/test_session_layout.py": UNIT,
    "tests/plugin/test_rootdir.py": SUBPROCESS,
    "tests/plugin/test_slurm_args_option.py": SUBPROCESS,
    "tests/reference/test_cache.py": UNIT,
    "tests/reference/test_cache_key.py": UNIT,
    "tests/reference/test_golden.py": UNIT,
    "tests/reliability/test_concurrency.py": SUBPROCESS,
    "tests/reliability/test_damaged_files.py": HEAVY,
    "tests/reliability/test_faults.py": SUBPROCESS,
    "tests/reliability/test_fuzz_config.py": HEAVY,
    "tests/reliability/test_fuzz_layout.py": HEAVY,
    "tests/reliability/test_fuzz_trainer_flags.py": HEAVY,
    "tests/reliability/test_idempotent.py": TORCHRUN,
    "tests/reliability/test_security.py": UNIT,
    "tests/report/test_artifacts.py": UNIT,
    "tests/report/test_baseline_divergence.py": UNIT,
    "tests/report/test_case_view.py": UNIT,
    "tests/report/test_cli.py": UNIT,
    "tests/report/test_foreign_trainer.py": UNIT,
    "tests/report/test_gradients_not_compared.py": UNIT,
    "tests/report/test_location.py": UNIT,
    "tests/report/test_noise.py": UNIT,
    "tests/report/test_plots.py": HEAVY,
    "tests/report/test_reading.py": UNIT,
    "tests/report/test_report.py": HEAVY,
    "tests/report/test_session_diff.py": UNIT,
    "tests/report/test_session_header.py": UNIT,
    "tests/report/test_throughput.py": UNIT,
    "tests/report/test_throughput_grouping.py": UNIT,
    "tests/report/test_trace_figure.py": HEAVY,
    "tests/report/test_verdict_plot.py": UNIT,
    "tests/report/test_workflow.py": UNIT,
    "tests/results/test_summary.py": UNIT,
    "tests/results/test_record_type.py": UNIT,
    "tests/results/test_records.py": SUBPROCESS,
    "tests/results/test_session_header.py": UNIT,
    "tests/runner/test_kept_unknown.py": UNIT,
    "tests/runner/test_checkpoints.py": UNIT,
    "tests/runner/test_diagnosis.py": UNIT,
    "tests/runner/test_replay_stage.py": SUBPROCESS,
    "tests/runner/test_fp64_ratio.py": UNIT,
    "tests/runner/test_judge_stages.py": UNIT,
    "tests/runner/test_plan_stage.py": UNIT,
    "tests/runner/test_settings.py": UNIT,
    "tests/runner/test_updates_verdict.py": UNIT,
    "tests/runner/test_skip_reason.py": UNIT,
    "tests/runner/test_trace_flags.py": UNIT,
    "tests/runner/test_trace_session.py": TORCHRUN,
    "tests/runner/test_trace_plants.py": TORCHRUN,
    "tests/runner/test_stages.py": SUBPROCESS,
    "tests/contracts/test_programs.py": UNIT,
    "tests/contracts/llmc/test_checkpoint.py": UNIT,
    "tests/contracts/llmc/test_tokens.py": UNIT,
    "tests/contracts/test_contracts.py": UNIT,
    "tests/contracts/test_flags.py": UNIT,
    "tests/contracts/test_models.py": UNIT,
    "tests/contracts/test_rank_exit.py": UNIT,
    "tests/contracts/test_records.py": UNIT,
    "tests/contracts/test_tolerance.py": UNIT,
    "tests/contracts/test_trace.py": UNIT,
    "tests/test_assets.py": UNIT,
    "tests/test_docs.py": UNIT,
    "tests/test_docs_site.py": UNIT,
    "tests/test_imports.py": UNIT,
    "tests/test_inner_sessions.py": SUBPROCESS,
    "tests/test_package_maps.py": UNIT,
    "tests/test_tiers.py": UNIT,
    "tests/trainer/models/test_gpt2.py": HEAVY,
    "tests/trainer/models/test_llama3.py": HEAVY,
    "tests/trainer/models/test_mixtral.py": HEAVY,
    "tests/trainer/models/test_qwen3.py": HEAVY,
    "tests/trainer/models/test_parts.py": UNIT,
    "tests/trainer/models/test_train_specs.py": UNIT,
    "tests/trainer/test_replay.py": HEAVY,
    "tests/trainer/parallel/test_e2e.py": TORCHRUN,
    "tests/trainer/parallel/test_plan.py": UNIT,
    "tests/trainer/parallel/test_tensor_parallel.py": UNIT,
    "tests/trainer/test_coverage.py": UNIT,
    "tests/trainer/test_data.py": UNIT,
    "tests/trainer/test_flags.py": UNIT,
    "tests/trainer/test_adam_step_count.py": UNIT,
    "tests/trainer/test_lr_schedule.py": UNIT,
    "tests/trainer/test_lr_schedule_recorded.py": UNIT,
    "tests/trainer/test_precision_check.py": HEAVY,
    "tests/trainer/test_gradient_dump.py": UNIT,
    "tests/trainer/test_host_memory.py": SUBPROCESS,
    "tests/trainer/test_profiling.py": HEAVY,
    "tests/trainer/test_trainer_cli.py": HEAVY,
}

# "file::test" (a test function, parameters left out) -> its tier, where it differs from its
# file's.
TESTS: dict[str, str] = {
    "tests/benchmarks/test_history_detection.py::test_the_render_is_timed_cold_nightly_and_again_and_the_nightly_renders_every_night": SUBPROCESS,
    "tests/runner/test_updates_verdict.py::test_a_reference_that_dumps_no_updates_is_an_error_not_a_pass": TORCHRUN,
    "tests/benchmarks/test_gpu_check.py::test_cuda_refused_without_a_device": SUBPROCESS,
    "tests/benchmarks/test_gpu_check.py::test_summary_tables_are_markdown_tables": UNIT,
    "tests/benchmarks/test_numerics_scripts.py::test_trainer_flags_of_each_launcher": TORCHRUN,
    "tests/compare/test_calibration.py::test_the_module_is_torch_free": SUBPROCESS,
    "tests/launch/test_multinode.py::test_a_lost_node_is_reported_and_no_agent_is_left": TORCHRUN,
    "tests/launch/test_multinode.py::test_agents_past_the_timeout_are_all_killed": SUBPROCESS,
    "tests/launch/test_multinode.py::test_two_agents_form_one_world_with_the_verdicts_of_one_node": TORCHRUN,
    "tests/launch/test_slurm.py::test_cases_run_through_slurm_with_the_local_verdicts": TORCHRUN,
    "tests/launch/test_slurm.py::test_jobs_are_sized_from_the_case": UNIT,
    "tests/launch/test_slurm.py::test_node_exit_codes_come_from_the_nodes_then_srun_else_unknown": UNIT,
    "tests/launch/test_slurm_docs.py::test_the_documented_substitutions_still_match_the_docs": UNIT,
    "tests/launch/test_slurm_docs.py::test_the_nightly_runs_and_its_cancel_step_leaves_no_job": TORCHRUN,
    "tests/plugin/test_slurm_args_option.py::test_option_value_pairs_are_joined_and_nothing_else": UNIT,
    "tests/launch/test_slurm.py::test_scontrol_lines_and_exit_codes_parse": UNIT,
    "tests/launch/test_slurm.py::test_without_slurm_the_reason_is_given": UNIT,
    "tests/layout/test_bounds.py::test_the_old_memory_errors_are_layout_errors_under_a_memory_limit": SUBPROCESS,
    "tests/layout/test_chunk_search.py::test_local_search_gap_to_the_exact_search": HEAVY,
    "tests/layout/test_layout.py::test_invariants": HEAVY,
    "tests/layout/test_layout.py::test_json_and_chunk_layout_round_trip": HEAVY,
    "tests/layout/test_layout.py::test_megatron_round_trip": HEAVY,
    "tests/layout/test_solver.py::test_solver_is_deterministic_and_scale_invariant": HEAVY,
    "tests/layout/test_solver.py::test_solver_matches_brute_force": HEAVY,
    "tests/layout/test_suggest.py::test_cli_error_is_one_line_with_exit_code_2": SUBPROCESS,
    "tests/layout/test_suggest.py::test_cli_prints_the_flag_alone_on_stdout": SUBPROCESS,
    "tests/layout/test_suggest.py::test_the_name_given_to_the_trainer_stands_for_its_per_rank_files": TORCHRUN,
    "tests/layout/test_suggest.py::test_tool_agrees_with_from_costs": HEAVY,
    "tests/plugin/test_session_layout.py::test_a_single_process_run_has_its_output_as_rank_0_logs": TORCHRUN,
    "tests/plugin/test_session_layout.py::test_git_facts_outside_and_inside_a_work_tree": SUBPROCESS,
    "tests/reliability/test_fuzz_trainer_flags.py::test_fuzzed_flags_through_a_real_run": TORCHRUN,
    "tests/reliability/test_security.py::test_hostile_values_arrive_verbatim_as_one_argv_item": SUBPROCESS,
    "tests/logs/test_cli.py::test_module_entry_point": SUBPROCESS,
    "tests/logs/test_cli.py::test_the_modules_are_torch_free": SUBPROCESS,
    "tests/report/test_cli.py::test_module_entry_point": SUBPROCESS,
    "tests/report/test_location.py::test_harness_output_wins_and_is_read_by_a_subprocess_elsewhere": SUBPROCESS,
    "tests/report/test_workflow.py::test_every_run_block_is_valid_bash": SUBPROCESS,
    "tests/report/test_workflow.py::test_the_workflow_is_valid_for_github": SUBPROCESS,
    "tests/contracts/test_contracts.py::test_each_spec_module_loads_no_torch_and_no_other_harness_package": SUBPROCESS,
    "tests/contracts/test_contracts.py::test_harness_side_packages_load_no_torch_and_no_trainer": SUBPROCESS,
    "tests/contracts/test_contracts.py::test_the_probe_sees_torch": SUBPROCESS,
    "tests/contracts/test_models.py::test_importing_the_registry_loads_no_torch": SUBPROCESS,
    "tests/test_assets.py::test_cli_writes_assets": SUBPROCESS,
    "tests/test_docs.py::test_collect_blocks_collect": SUBPROCESS,
    "tests/test_docs.py::test_run_blocks_run_as_written": TORCHRUN,
    "tests/test_docs_site.py::test_the_site_builds_strict_with_every_page_and_the_tables_from_their_sources": SUBPROCESS,
    "tests/test_docs_site.py::test_a_planted_break_fails_the_build_naming_it": SUBPROCESS,
    "tests/test_docs_site.py::test_a_stale_copy_of_a_generated_table_is_not_what_the_site_shows": SUBPROCESS,
    "tests/test_docs_site.py::test_the_copies_in_docs_are_the_generated_tables": HEAVY,
    "tests/test_imports.py::test_device_settings_without_a_gpu_driver_do_not_load_torch": SUBPROCESS,
    "tests/test_imports.py::test_harness_modules_import_without_torch": SUBPROCESS,
    "tests/test_tiers.py::test_an_undeclared_test_fails_naming_what_to_add": SUBPROCESS,
    "tests/test_tiers.py::test_the_main_job_collects_the_config_alone": SUBPROCESS,
    "tests/contracts/test_rank_exit.py::test_the_process_ends_with_its_code_or_signal": SUBPROCESS,
    "tests/trainer/test_trainer_cli.py::test_cli_trains_and_writes_records_step_lines_and_gradients": SUBPROCESS,
    "tests/trainer/test_trainer_cli.py::test_profiled_run_feeds_the_suggestion_tool": SUBPROCESS,
}


# -- the marks a test of ours can carry, and a -m that selects none of them ---------------------
#
# `python -m pytest -m pipeline_layout` (the main job) collects testpaths, tests/ among them:
# importing its ~100 modules to deselect every one of their 1400 tests took 7 s of the job's
# 8 s of collection, in the controller and again in every xdist worker. A test of ours carries
# one tier, perhaps `slow`, and pytest's own marks, never a config case's tag (tests/conftest.py
# fails a test with any other mark), so whether a -m expression can select any of them is known
# before importing one: tests/conftest.py skips collecting tests/ when it cannot.

OWN_MARKS = ("slow",)
PYTEST_MARKS = ("parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings")


def selects_none_of_ours(markexpr: str, evaluate) -> bool:
    """Whether the -m expression `markexpr` is false for every mark set a test of ours can
    carry: exactly one tier, with any of OWN_MARKS and PYTEST_MARKS. `evaluate(markexpr, marks)`
    is the expression's value for a test carrying `marks` (pytest's own evaluation)."""
    if not markexpr.strip():
        return False
    optional = OWN_MARKS + PYTEST_MARKS
    for tier in TIERS:
        for bits in range(1 << len(optional)):
            marks = {tier} | {m for i, m in enumerate(optional) if bits >> i & 1}
            if evaluate(markexpr, marks):
                return False
    return True
