"""The benchmarks of chapters 16 and 18 run and print what they claim (no timing is asserted)."""
import pytest

from benchmarks import fsdp_memory, pipeline_bubble


@pytest.mark.slow
def test_pipeline_bubble_prints_a_row_per_schedule_and_draws(tmp_path, capfd):
    png = tmp_path / "timeline.png"
    pipeline_bubble.main(["--world-size", "2", "-m", "1,2", "--forward-ms", "4", "-n", "1", "-w", "0",
                          "--plot", str(png)])
    out = capfd.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    assert [(r[1], r[2]) for r in rows] == [("1", "gpipe"), ("1", "1f1b"), ("2", "gpipe"), ("2", "1f1b")]
    assert [r[6] for r in rows] == ["0.500", "0.500", "0.333", "0.333"]     # (p-1)/(m+p-1)
    assert [r[7] for r in rows] == ["1", "1", "2", "2"]                     # stage 0 holds m, or p - 0 = 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_pipeline_bubble_prints_interleaved_and_zero_bubble_beside_their_formulas(capfd):
    pipeline_bubble.main(["--world-size", "2", "-m", "2", "--forward-ms", "4", "-n", "1", "-w", "0",
                          "--schedule", "interleaved,zb-h1", "--chunks", "2"])
    rows = [line.split() for line in capfd.readouterr().out.splitlines() if line.strip().startswith("2 ")]
    assert [(r[1], r[2]) for r in rows] == [("2", "interleaved"), ("2", "zb-h1")]
    assert [r[6] for r in rows] == ["0.200", "0.143"]     # (p-1)/(vm+p-1); (p-1)/(3m+p-1)
    assert [r[7] for r in rows] == ["4", "2"]             # rank 0 holds both chunks' m; ZB-H1 at most p


@pytest.mark.slow
def test_fsdp_memory_holds_s_over_n_at_rest_and_one_more_layer_at_the_peak(capfd):
    fsdp_memory.main(["--world-size", "2", "--layers", "3", "--width", "64", "--no-prefetch"])
    row = [line.split() for line in capfd.readouterr().out.splitlines() if line.strip().startswith("2 ")][0]
    rest, s_over_n, peak, plus_one, _, after = row[1:]
    assert rest == s_over_n == after and peak == plus_one


@pytest.mark.slow
def test_zigzag_balance_prints_both_layouts_beside_the_model(capfd):
    from benchmarks import zigzag_balance
    zigzag_balance.main(["--world-size", "2", "--seq", "64", "-n", "1", "-w", "0"])
    rows = [line.split() for line in capfd.readouterr().out.splitlines() if line.strip().startswith("2 ")]
    assert [r[1] for r in rows] == ["plain", "zigzag"]
    assert [r[-2] for r in rows] == ["1.33", "1.00"]      # busiest/mean of the score entries: 2N/(N+1), 1
