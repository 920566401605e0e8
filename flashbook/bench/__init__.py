"""Benchmarks: what attention costs, on paper and on a GPU (chapters 9 and 10).

One module per job, in the order chapter 9 uses them; every public name is
importable from ``flashbook.bench``:

- ``costs``:        FLOPs, bytes moved through HBM, bytes held, the roofline floor (no GPU)
- ``source_check``: the seed article's performance table checked against that arithmetic
- ``impls``:        the implementations compared: plain PyTorch, SDPA backends, our kernels
- ``harness``:      one implementation on one shape: the timer, memory, the check, the sweep
- ``sweeps``:       block sizes of the forward kernel; chapter 10's performance ladder
- ``records``:      CSV rows and provenance, where results live, text tables
- ``runs``:         the recorded runs by name: the index beside them (``index.json``)
- ``readback``:     the recorded runs read back: the newest of a kind, ratios, targets, roofline
- ``blocks``:       the recorded block sweep: shared memory, fits per chip, the explorer's state
- ``experiments``:  chapter 10's recorded experiments: descriptors, Gluon schedules, host overhead
- ``profiles``:     Nsight Compute's readings of the kernels: executed tensor ops, DRAM, L2, spills
                    (``from flashbook.bench import profiles``; ``decoding``: chapter 11's records)
- ``peer``:         a peer's kernel file (Triton's tutorial, supplied by the user) timed beside ours
- ``cli``:          ``python -m flashbook.bench`` (``--quick``, ``--sweep-blocks``, ``--ladder``,
                    ``--peer``)
"""
from .. import runtime  # noqa: F401  (chip facts, used beside the costs)
from .costs import (  # noqa: F401
    GB, PASSES, causal_pairs, attention_flops, attention_hbm_bytes, attention_memory_bytes,
    roofline_ms, tflops, naive_memory_estimate,
)
from .source_check import (  # noqa: F401
    SEED_SHAPE, SEED_CHIP, VERDICTS, Claim, SeedCheck, check_seed_table,
)
from .impls import (  # noqa: F401
    naive_attention, SDPA_BACKENDS, IMPLEMENTATIONS, sdpa_attention, flashbook_impls,
    resolve_impl,
)
from .harness import (  # noqa: F401
    Shape, shape_label, TOKENS, MODEL_WIDTH, heads_for, make_shapes, STATUSES, TOLERANCE,
    ShapeRow, Result, RESULT_FIELDS, classify_error, rel_err, CudaTimer, graph_replay, time_ms,
    CudaMemory, make_inputs, reference_slice, check_slice, skip_reason, bench_case, run_tools, run_sweep,
    progress_bar,
)
from .sweeps import (  # noqa: F401
    SWEEP_SEQS, BLOCK_GRID, BlockResult, BLOCK_FIELDS, block_configs, run_steps, run_block_sweep,
    LADDER_SEQS, LadderResult, LADDER_FIELDS, run_ladder,
)
from .records import (  # noqa: F401
    PACKAGE_DIR, CHECKOUT_DIR, RESULTS_ENV, COMMIT_ENV, results_root, PROVENANCE_KEYS, source_digest, git_commit,
    gpu_info, match_chip, command_line, collect_provenance, write_csv, read_csv,
    write_provenance, default_out_dir, format_table, format_block_table, format_ladder_table,
)
from .runs import (  # noqa: F401
    INDEX, load_index, list_runs, run_paths, run_path, csv_runs, recorded_file, load_recorded_json,
)
from .readback import (  # noqa: F401
    SHAPE_KEYS, provenance_for, provenance_summary, run_date, find_runs, latest_results,
    latest_blocks, latest_ladder, LADDER_KEYS, ladder_speedups, load_results, results_frame,
    speedup_table, Target, PERFORMANCE_TARGETS, target_table, target_summary,
    roofline_points, roofline_ceilings, seed_shape_rows,
)
from .blocks import (  # noqa: F401
    block_shared_bytes, block_fits, best_blocks, BlockState, block_state,
)
from .experiments import (  # noqa: F401
    HOPPER_EXPERIMENT, AUTOTUNE_RUN, load_hopper_experiment, hopper_experiment_table,
    LAZY_EXPERIMENT, STATIC_SHAPE_EXPERIMENT, variant_table, GLUON_EXPERIMENTS, GLUON_SCHEDULES,
    gluon_schedule_table, GLUON_EXP2_EXPERIMENTS, fma_share_table, HOST_OVERHEAD_RUN,
    host_overhead_tables, GLUON_SHORT_SWEEPS, SHORT_FAMILIES, short_sweep_table, schedule_pairs,
)
from .peer import (  # noqa: F401
    DEFAULT_FUNC, PEER_ROWS, PEER_SEQS, PEER_HEAD_DIMS, PEER_DTYPE, COMPARED, PeerSpec, split_peer,
    load_peer, peer_shapes, PeerResult, PEER_FIELDS, measure, compare, run_peer, peer_provenance,
    format_peer_table, PEER_RUNS, load_peer_run, peer_ratio_table, GLUON_PEER_RUNS, GLUON_GRAPH_RUNS,
    GLUON_WIDE_GRAPH_RUN, GLUON_DEFAULT_GRAPH_RUNS, peer_runs_table,
)
from .cli import (  # noqa: F401
    DEFAULT_SEQS, DEFAULT_HEAD_DIMS, QUICK_SEQS, QUICK_HEAD_DIMS, parse_seq_list,
    parse_int_list, parse_causal, parse_impl_list, build_parser, parse_args, NO_GPU_MESSAGE,
    main,
)
