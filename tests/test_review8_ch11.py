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
