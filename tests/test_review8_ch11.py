"""Chapter 11's helpers added after the eighth review (flashbook.bench.chapter11): the host's
times of one run, the decoding bandwidth against the datasheet, and the ring's bytes and link
rate. Each is checked against the library or the recorded files it reads."""
import json

import pandas as pd
import pytest
import torch

from conftest import require
from flashbook import bench, distributed
from flashbook.bench import chapter11


class _CountingRing:
    """Stands in for distributed._Ring: counts the bytes each start() sends, sends nothing."""

    def __init__(self):
        self.sent = 0

    def start(self, send, recv):
        self.sent += sum(t.numel() * t.element_size() for t in send)
        return []

    @staticmethod
    def wait(works):
        pass


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_ring_send_factor_counts_what_the_ring_sends(world, dtype):
    """The forward and backward with communication only send ring_send_factor K/V blocks."""
    shard = (1, 2, 8, 4)
    q, k, v, do = (torch.zeros(shard, dtype=dtype) for _ in range(4))
    lse = torch.zeros(shard[:3], dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    for rank in range(world):
        ring = _CountingRing()
        common = dict(causal=True, scale=0.5, layout="zigzag", ring=ring, rank=rank, world=world,
                      compute=False, communicate=True)
        distributed._ring_forward(q, k, v, **common)
        distributed._ring_backward(q, k, v, q, lse, do, **common)
        kv_bytes = 2 * k.numel() * k.element_size()              # ring_bench's kv_bytes_per_hop
        assert ring.sent == chapter11.ring_send_factor(world, k.element_size()) * kv_bytes
    assert chapter11.ring_send_factor(2, 2) == 6                  # K/V twice, float32 dK/dV twice


def test_ring_link_rates_are_the_bytes_over_comm_ms():
    ring = chapter11.ring_runs()
    require(ring is not None, "no recorded ring run")
    df = ring[0]
    link = chapter11.ring_link(df, 450e9)
    for _, row in df.iterrows():
        sent = 6 * row["kv_bytes_per_hop"]                       # two ranks, bf16
        got = link.loc[row["n"]]
        assert got["MB sent per rank"] == round(sent / 1e6)
        assert got["GB/s each way"] == round(sent / row["comm_ms"] / 1e6)
        assert got["% of the link"] == round(100 * sent / (row["comm_ms"] / 1e3) / 450e9)
        assert got["compute_ms / comm_ms"] == round(row["compute_ms"] / row["comm_ms"], 1)
    assert (link["% of the link"] < 100).all() and (link["compute_ms / comm_ms"] > 1).all()


def test_host_paths_reads_one_run():
    runs = bench.run_paths("decode_host")
    require(len(runs) >= 2, "no recorded host runs")
    table, newest, first = chapter11.host_paths()
    assert newest == json.loads((runs[-1] / "host.json").read_text())
    assert first == json.loads((runs[0] / "host.json").read_text())["2048"]["call"]["median_us"]
    at = newest["2048"]
    col = table["2K cache"]
    assert col["flash_decode, checked path (whole call)"] == round(at["checked_path"]["median_us"], 1)
    assert col["flash_decode, short path (whole call)"] == round(at["call"]["median_us"], 1)
    assert col["SDPA on cuDNN (whole call)"] == round(at["sdpa_cudnn"]["median_us"], 1)
    launches = at["launch_jit:split"]["median_us"] + at["launch_jit:combine"]["median_us"]
    assert col["checked path: Triton's two launches"] == round(launches, 1)
    # the short path's own saving is this run's difference; the first run's call was slower still
    assert at["sdpa_cudnn"]["median_us"] < at["call"]["median_us"] < at["checked_path"]["median_us"] < first


def test_decode_bandwidth_is_a_share_of_the_datasheet():
    from flashbook import runtime

    shares = chapter11.decode_shares()
    require(shares is not None, "no recorded decoding run")
    ours = shares[2]
    table = chapter11.decode_bandwidth(ours, runtime.chip("H200").hbm_tb_s)
    tb_s = ours.pivot_table(index="seq", columns="batch", values="kv_tb_s_graph")
    assert table.shape == tb_s.shape
    for seq in tb_s.index:
        for batch in tb_s.columns:
            x = tb_s.loc[seq, batch]
            assert table.loc[seq, batch] == f"{x:.2f} ({100 * x / 4.8:.0f}%)"
    assert tb_s.max().max() < 4.8                                 # reads alone stay under the datasheet
    assert isinstance(table, pd.DataFrame)


def test_host_paths_shows_2k_alone_where_the_loop_may_wait_on_the_gpu():
    """At 32K the short path's time per call in the back-to-back loop is within a few per cent of
    the GPU's own step at batch 1 (a CUDA graph), so the chapter's table shows the 2K column alone."""
    runs = bench.run_paths("decode_host")
    require(len(runs) >= 2, "no recorded host runs")
    table, newest, _ = chapter11.host_paths()
    assert list(table.columns) == ["2K cache"]
    every, _, _ = chapter11.host_paths(seqs=None)
    assert list(every.columns) == [f"{int(seq) // 1024}K cache" for seq in newest]
    shares = chapter11.decode_shares()
    require(shares is not None and "32768" in newest, "no recorded decoding run at 32K")
    ours = shares[2]
    gpu_us = 1000 * ours[(ours["batch"] == 1) & (ours["seq"] == 32768)]["graph_ms"].iloc[0]
    host_us = newest["32768"]["call"]["median_us"]
    assert abs(host_us / gpu_us - 1) < 0.05                        # the loop's pace is the GPU's there


@pytest.mark.parametrize("f, b", [(989e12, 450e9), (312e12, 310e9), (65e12, 16e9)])
def test_ring_min_shard_by_search(f, b):
    """ring_min_shard against a search over c with each step's FLOPs and bytes written out:
    a causal zigzag step computes half a block; a backward step 2.5 times the forward's FLOPs
    and sends K/V with float32 dK/dV (the bytes ring_send_factor counts for the backward)."""
    d, heads = 128, 8
    kv_bytes = 2 * d * heads * 2                                   # K and V per token, bf16
    dkv_bytes = 2 * d * heads * 4                                  # dK and dV per token, float32
    assert dkv_bytes + kv_bytes == 3 * kv_bytes
    for causal in (False, True):
        for backward in (False, True):
            flops = 4 * d * heads * (0.5 if causal else 1) * (2.5 if backward else 1)   # per c^2
            sent = kv_bytes + (dkv_bytes if backward else 0)                           # per c
            c = 1
            while flops * c * c / f < sent * c / b:
                c += 1
            assert chapter11.ring_min_shard(f, b, causal, backward) == c
    assert chapter11.ring_min_shard(f, b) == -(-f // b)          # exercise 3's answer


def test_ch11_ring_thresholds_and_takeaway_come_from_the_run():
    """The ring section: the F / B threshold is for an unmasked forward step, the causal and
    backward ones are glued from ring_min_shard, and the closing takeaway's share is the run's
    largest comm / compute, which falls as the shards grow."""
    from flashbook import runtime
    from notebook_text import cell_source, flat, run_glued

    ring = chapter11.ring_runs()
    require(ring is not None, "no recorded ring run")
    ring_df = ring[0]
    h200 = runtime.chip("H200")
    glued, _ = run_glued(cell_source("11_decoding_and_many_gpus", "c11-link"), quiet=True,
                         ring_df=ring_df, chapter11=chapter11, H200=h200, math=__import__("math"))
    f = h200.bf16_tflops * 1e12
    assert glued["min_shard_tokens"] == f"{chapter11.ring_min_shard(f, 450e9):,}"
    assert glued["min_shard_causal"] == f"{chapter11.ring_min_shard(f, 450e9, causal=True):,}"
    assert glued["min_shard_bwd"] == f"{chapter11.ring_min_shard(f, 450e9, True, True):,}"
    share = (ring_df.sort_values("n")["comm_ms"] / ring_df.sort_values("n")["compute_ms"])
    assert glued["comm_share_hi"] == f"{100 * share.max():.0f}" and share.is_monotonic_decreasing
    assert int(ring_df["n"].min()) // int(ring_df["world_size"].iloc[0]) >= int(glued["min_shard_bwd"].replace(",", ""))
    text = flat(cell_source("11_decoding_and_many_gpus", "c11-41") + "\n" + cell_source("11_decoding_and_many_gpus", "c11-45"))
    for said in ("That is for an unmasked forward step: a causal zigzag step computes half a block",
                 "{glue:text}`min_shard_causal`", "{glue:text}`min_shard_bwd`",
                 "even with no overlap, its transfers would add at most {glue:text}`comm_share_hi`%"):
        assert said in text, said
    assert "these timings cannot say" not in text


def test_ch11_names_split_k_and_num_stages_rightly():
    from notebook_text import flat, markdown

    text = flat(markdown("11_decoding_and_many_gpus"))
    assert "the K stands for the keys" not in text
    assert ("the name comes from GEMMs, general matrix multiplications, where K is the dimension summed over; "
            "here that is the keys") in text
    assert "chapter 7's `num_stages`" not in text and "chapter 6's `num_stages`" in text
